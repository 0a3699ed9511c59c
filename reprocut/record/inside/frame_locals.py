"""A function frame's local variables, read without keeping them alive.

Before Python 3.13, `frame.f_locals` of a function copies its variables into a dict that the
frame keeps: the values read stay referenced by it after the function rebinds the names, until
the next read. Read at a step's end, the training loop's frame kept the last step's batch and
activations alive all through the next step: on the H200 the memory rerun of a checkpointed
block held 28 MiB more at its out-of-memory failure than the plain run said it had (two
`queries` and two `docs` of 16 MB where the script holds one of each). `local_values` hands back
a copy and empties the frame's dict, so the script's memory is what it is under plain
`python`. The next read fills the dict again from the variables themselves.

Emptying it is left alone while a trace function is set: a tracer's return writes the dict back
into the frame's variables, and an emptied dict written back would delete them. From Python
3.13 `f_locals` is a view of the variables themselves (PEP 667), and module and class bodies
hold their namespaces in it: those are returned as they are.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Any

_SNAPSHOTS = sys.version_info < (3, 13)


def local_values(frame: FrameType) -> Mapping[str, Any]:
    """The frame's variables by name; the frame keeps no copy of them afterwards."""
    values = frame.f_locals
    if not _SNAPSHOTS or not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return values  # a live view (3.13), or a module's or class body's own namespace
    copied = dict(values)
    if sys.gettrace() is None and threading.gettrace() is None:
        values.clear()
    return copied
