"""`python -m reprocut` is the `reprocut` command."""

from reprocut.cli import entry

entry()
