"""A process that died without an exception: where it was, from its faulthandler dump.

A segfault or an abort leaves no traceback, but the user's process runs with faulthandler on,
which prints the Python stack of the thread that crashed to stderr (most recent call first).
The innermost frame in the user's own files is the line a crash is reported at.
"""

from __future__ import annotations

import linecache
import re

from reprocut.model.case import SourceLocation
from reprocut.record.inside.frames import is_user_file

_FATAL = re.compile(r"^Fatal Python error: (?P<what>.*)$", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+)$')


def faulthandler_location(stderr: str) -> SourceLocation | None:
    """The innermost user frame of the crashing thread in the last faulthandler dump."""
    fatal = list(_FATAL.finditer(stderr))
    if not fatal:
        return None
    lines = stderr[fatal[-1].end() :].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
    if start is None:  # one thread only: its header is "Stack (most recent call first):"
        start = next((i for i, line in enumerate(lines) if "most recent call first" in line), None)
    if start is None:
        return None
    for line in lines[start + 1 :]:
        frame = _FRAME.match(line)
        if frame is None:
            break  # the end of that thread's stack
        if is_user_file(frame["file"]):
            number = int(frame["line"])
            text = linecache.getline(frame["file"], number).strip()
            return SourceLocation(frame["file"], number, text, frame["function"])
    return None


def fatal_error(stderr: str) -> str:
    """ "Segmentation fault" from the last "Fatal Python error: ..." line, or ""."""
    fatal = list(_FATAL.finditer(stderr))
    return fatal[-1]["what"].strip() if fatal else ""
