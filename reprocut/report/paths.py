"""Paths as people should read them, and as they may be pasted: never a home directory.

A file in the user's project is shown relative to a base folder (the script's folder in
report.md, the working directory in the terminal); an installed library's file from its package
on (`transformers/models/bert/modeling_bert.py`); anything else under the home directory as `~/`.
"""

from __future__ import annotations

import os
import re

from reprocut.model.case import SourceLocation
from reprocut.model.notebook import place_of

_PACKAGE_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def shown_path(path: str, base: str = "") -> str:
    """`path` for display: relative to `base` if under it, else from an installed package, else
    with the home directory as `~`."""
    base = base.rstrip(os.sep)
    if base and path.startswith(base + os.sep):
        return path[len(base) + 1 :]
    for marker in _PACKAGE_DIRS:
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return without_home(path)


def where_text(location: SourceLocation | None, base: str = "", *, missing: str = "?") -> str:
    """`train.py:41` as shown_path shows the file, or a notebook's `train.ipynb, cell 7 (In [5]),
    line 3`: one way of naming a line for every panel."""
    if location is None:
        return missing
    place = place_of(location.file, location.line)
    if place is not None:
        return place.describe(base)
    return f"{shown_path(location.file, base)}:{location.line}"


def without_home(text: str) -> str:
    """Every mention of the home directory written as `~`."""
    home = os.path.expanduser("~").rstrip(os.sep)
    if not home or not os.path.isabs(home):
        return text
    return _whole_path(home).sub("~", text)


def relative_to_folder(text: str, folder: str) -> str:
    """Mentions of `folder` (and paths under it) made relative to it, the home directory `~`."""
    folder = folder.rstrip(os.sep)
    if folder:
        text = re.sub(re.escape(folder + os.sep), "", text)
        text = _whole_path(folder).sub(".", text)
    return without_home(text)


def _whole_path(path: str) -> re.Pattern[str]:
    """`path` where it is a whole path or a path's head: not `/rootfs` for `/root`."""
    return re.compile(re.escape(path) + r"(?![\w.-])")
