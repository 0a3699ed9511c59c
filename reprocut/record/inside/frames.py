"""Where in the user's code are we? The innermost stack frame in the user's own files.

User code is anything that is not torch, reprocut, the standard library or an installed package:
the script and its sibling modules. Lookups are cached per code object, since they run per op.
The call site is the innermost frame outside torch, reprocut and the standard library: under
the HF Trainer the user's line is `trainer.train()`, the call site transformers' own line.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import torch

from reprocut import PACKAGE_DIR
from reprocut.model.case import SourceLocation

_TORCH_DIR = os.path.dirname(torch.__file__)
_REPROCUT_DIR = PACKAGE_DIR
_LIBRARY_DIRS = tuple(
    {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
        _TORCH_DIR,
        _REPROCUT_DIR,
    }
)


_COMPILED_SOURCES = (".pyx", ".pxd", ".pxi")
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
_NOT_CALLERS = (os.path.join(_TORCH_DIR, ""), os.path.join(_REPROCUT_DIR, ""))


def is_caller_file(filename: str) -> bool:
    """A file whose frame can be the call site: anything but torch, reprocut, the standard
    library and generated code (`<string>`, `<frozen runpy>`). Installed packages count."""
    if filename.startswith("<") or filename.startswith(_NOT_CALLERS):
        return False
    in_packages = "site-packages" in filename or "dist-packages" in filename
    return in_packages or not filename.startswith(_STDLIB_DIR)


def is_user_file(filename: str) -> bool:
    """User code: anything that is not torch, reprocut, the stdlib or an installed package.

    The script and its siblings run from absolute paths (the child makes them so). A relative
    name is a compiled extension's: Cython puts frames such as `cupy_backends/cuda/libs/
    cublas.pyx` into tracebacks, and taking one for the user's line hid the cuBLAS call that
    raised on the H200."""
    if filename.startswith("<") or filename.endswith(_COMPILED_SOURCES):
        return False
    if not os.path.isabs(filename):
        return False
    return not filename.startswith(_LIBRARY_DIRS) and "site-packages" not in filename


_USER, _CALLER, _TORCH = 1, 2, 4
MODULE_CALL = torch.nn.Module._call_impl.__code__  # a frame of it: a module being called


def module_calls(frame: FrameType | None) -> list[FrameType]:
    """The frames of the modules being called, innermost first (see ModuleNames.innermost)."""
    calls = []
    while frame is not None:
        if frame.f_code is MODULE_CALL:
            calls.append(frame)
        frame = frame.f_back
    return calls


@dataclass(slots=True)
class StackView:
    """What a snapshot needs from the stack, found in one walk: on a launch-bound GPU loop
    every asserting op takes one, and three walks cost as much as the copies themselves."""

    user: list[tuple[FrameType, int]] = field(default_factory=list)  # innermost first
    caller: tuple[FrameType, int] | None = None  # innermost not torch's, reprocut's, stdlib's
    library: FrameType | None = None  # outermost torch frame inside the innermost user frame
    modules: list[FrameType] = field(default_factory=list)  # Module calls, innermost first

    def source(self) -> SourceLocation | None:
        if not self.user:
            return None
        frame, line = self.user[0]
        return location(frame.f_code, line)

    def call_site(self) -> SourceLocation | None:
        if self.caller is None:
            return None
        frame, line = self.caller
        return location(frame.f_code, line)


_LOCATIONS: dict[tuple[CodeType, int], SourceLocation] = {}
MAX_LOCATIONS = 10_000


def location(code: CodeType, line: int) -> SourceLocation:
    """The SourceLocation of a line of `code`, made once: every asserting op of every step
    asks for its line and call site, and the same few lines come back step after step."""
    key = (code, line)
    found = _LOCATIONS.get(key)
    if found is None:
        if len(_LOCATIONS) >= MAX_LOCATIONS:  # code made on the fly, say: start over
            _LOCATIONS.clear()
        found = _LOCATIONS[key] = SourceLocation(code.co_filename, line, function=code.co_name)
    return found


class UserFrames:
    """Finds the innermost stack frame in the user's own files (cached per code object)."""

    def __init__(self) -> None:
        self._is_user: dict[Any, bool] = {}
        self._is_caller: dict[Any, bool] = {}
        self._kinds: dict[Any, int] = {}

    def view(self, frame: FrameType | None) -> StackView:
        """The user frames, call site and public library frame from `frame` outward."""
        view = StackView()
        kinds = self._kinds
        library = None
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = kinds[code] = _kind_of(code.co_filename)
            if kind & _CALLER and view.caller is None:
                view.caller = (frame, frame.f_lineno)
            if kind & _USER:
                if not view.user:
                    view.library = library
                view.user.append((frame, frame.f_lineno))
            elif kind & _TORCH:
                if not view.user:
                    library = frame
                if code is MODULE_CALL:
                    view.modules.append(frame)
            frame = frame.f_back
        return view

    def is_user(self, code: CodeType) -> bool:
        user = self._is_user.get(code)
        if user is None:
            user = self._is_user[code] = is_user_file(code.co_filename)
        return user

    def find(self, frame: FrameType | None) -> SourceLocation | None:
        while frame is not None:
            code = frame.f_code
            if self.is_user(code):
                return SourceLocation(code.co_filename, frame.f_lineno, function=code.co_name)
            frame = frame.f_back
        return None

    def here(self) -> SourceLocation | None:
        return self.find(sys._getframe(1))

    def call_site(self, frame: FrameType | None) -> SourceLocation | None:
        """The innermost frame from `frame` outward that is not torch's, reprocut's or the
        standard library's: the line that called the torch API."""
        while frame is not None:
            code = frame.f_code
            caller = self._is_caller.get(code)
            if caller is None:
                caller = self._is_caller[code] = is_caller_file(code.co_filename)
            if caller:
                return SourceLocation(code.co_filename, frame.f_lineno, function=code.co_name)
            frame = frame.f_back
        return None

    def innermost_in_traceback(self, tb: Any) -> SourceLocation | None:
        found = None
        while tb is not None:
            code = tb.tb_frame.f_code
            if is_user_file(code.co_filename):
                found = SourceLocation(code.co_filename, tb.tb_lineno, function=code.co_name)
            tb = tb.tb_next
        return found


_TRACEBACK_FRAME = re.compile(
    r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$'
)


def user_frames_in(traceback_text: str) -> list[SourceLocation]:
    """The user's frames of a traceback as `traceback.format_list` wrote it (an outcome's
    `traceback`), outermost first, each with its line's text; the last traceback of a chain."""
    found: list[SourceLocation] = []
    lines = traceback_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            found = []
        match = _TRACEBACK_FRAME.match(line)
        if match and is_user_file(match["file"]):
            follows = lines[i + 1] if i + 1 < len(lines) else ""
            text = follows.strip() if follows.startswith("    ") else ""
            found.append(SourceLocation(match["file"], int(match["line"]), text, match["function"]))
    return found


def deepest_below(frames: list[SourceLocation], caller: SourceLocation) -> SourceLocation | None:
    """The deepest of `frames` (outermost first) below the last one at `caller`'s line: the
    user's code that ran inside the call made there (a custom op's implementation in a sibling
    module, the launch of its kernel); None when the call ran no user code, or is not there."""
    at = [i for i, f in enumerate(frames) if (f.file, f.line) == (caller.file, caller.line)]
    if not at or at[-1] == len(frames) - 1:
        return None
    return frames[-1]


def _kind_of(filename: str) -> int:
    kind = _USER if is_user_file(filename) else 0
    if is_caller_file(filename):
        kind |= _CALLER
    if filename.startswith(_TORCH_DIR):
        kind |= _TORCH
    return kind


_OVERRIDES = os.path.join(_TORCH_DIR, "overrides.py")
_OPS = os.path.join(_TORCH_DIR, "_ops.py")


def plain_python_frames(frames: list[Any]) -> list[Any]:
    """The traceback frames (`traceback.FrameSummary`) `python script.py` would show: without
    reprocut's own frames and without those torch runs only because reprocut's modes are on.

    A TorchFunctionMode turns `F.cross_entropy(...)` into cross_entropy -> handle_torch_function
    -> the mode's __torch_function__ -> cross_entropy again; a dispatch mode or a Python kernel
    adds `torch/_ops.py` frames under the op. Plain python shows cross_entropy once, then the
    error."""

    def ours(frame: Any) -> bool:
        return frame.filename.startswith(_REPROCUT_DIR) or frame.filename.startswith(
            "<frozen runpy"
        )

    drop = [ours(frame) for frame in frames]
    for i, frame in enumerate(frames):
        intercepted = i + 1 < len(frames) and ours(frames[i + 1])
        if frame.filename == _OVERRIDES and intercepted:  # handle_torch_function -> the mode
            drop[i] = True
            if i > 0 and "handle_torch_function" in (frames[i - 1].line or ""):
                drop[i - 1] = True  # the public function's detour through it
        elif frame.filename == _OPS and i > 0 and (ours(frames[i - 1]) or drop[i - 1]):
            drop[i] = True  # the op, as called by reprocut's mode or kernel
    return [frame for frame, dropped in zip(frames, drop, strict=True) if not dropped]
