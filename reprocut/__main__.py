"""`python -m reprocut` is the `reprocut` command."""

import sys

from reprocut.cli import main

sys.exit(main())
