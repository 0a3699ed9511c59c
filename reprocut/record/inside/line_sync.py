"""Wait for the GPU after every line of the user's code, to name the line that launched a fault.

A kernel the dispatcher never sees (CuPy, a C++/CUDA extension) may not raise at its launch even
with CUDA_LAUNCH_BLOCKING=1: the error waits for the next CUDA call, often a line later, or the
process's teardown. In the blocking rerun every launch has already finished when it returns, so a
synchronize before each new line of user code costs little and raises right after the line that
queued the fault. That line, the last one that ran, is the launch.

Inside the window of steps being localized (the rerun synchronizes around each op there too),
the tracer also hands each user frame to a `LaunchReader` as its lines are about to run, while
the device is healthy; once the fault shows, `read_launch` reads the launch's frame, so what
reached the kernel needs no run of its own.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from reprocut.model.case import SourceLocation
from reprocut.record.inside.frames import UserFrames
from reprocut.record.inside.launch_read import LaunchReader


class LineSync:
    """A tracer: before each user line (and at each user function's return) wait for the GPU;
    when that raises, `launch` is the line that ran last."""

    def __init__(
        self,
        cuda: Any = None,
        step: Callable[[], int | None] | None = None,
        *,
        window: tuple[int | None, int | None] | None = None,
        reader: LaunchReader | None = None,
    ) -> None:
        """`step`: the training step now (the recorder's count of optimizer steps): the fault's
        step is the one whose line launched the kernel, not the one it surfaced in. `window`:
        the first and last step to wait in (None: every step); `reader`: what reads the
        launch's inputs (see the module's docstring)."""
        import torch

        self._cuda = torch.cuda if cuda is None else cuda  # tests stand in a fake device
        self._frames = UserFrames()
        self._step = step
        self._window = window
        self._reader = reader
        self._last: tuple[str, int] | None = None
        self._last_frame: FrameType | None = None
        self._last_step: int | None = None
        self.launch: SourceLocation | None = None
        self.launch_step: int | None = None

    def __enter__(self) -> LineSync:
        sys.settrace(self._on_call)
        threading.settrace(self._on_call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._on_line if self._frames.is_user(frame.f_code) else None

    def _on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        step = None if self._step is None else self._step()
        inside = self._inside(step)
        if event in ("line", "return") and inside and self._cuda.is_initialized():
            try:
                self._cuda.synchronize()
            except Exception:
                if self.launch is None and self._last is not None:
                    self.launch = _location(*self._last)
                    self.launch_step = self._last_step
                raise
        if event == "line":
            self._last = (frame.f_code.co_filename, frame.f_lineno)
            self._last_frame = frame
            self._last_step = step
            if inside and self._reader is not None:
                self._reader.note(frame)  # the device is healthy: the wait above returned
        return self._on_line

    def _inside(self, step: int | None) -> bool:
        if self._window is None or step is None:
            return True
        first, last = self._window
        return (first is None or step >= first) and (last is None or step <= last)

    def read_launch(self, error: BaseException) -> bool:
        """Read what reached the launch into the reader's file: the frame of the line that ran
        last when a wait raised, else the innermost user frame `error` passed through (a launch
        that raised itself). False when there is no reader or nothing could be read."""
        if self._reader is None:
            return False
        if self.launch is not None and self._last_frame is not None:
            return self._reader.at_fault(self._last_frame, self.launch.line)
        found = None
        tb = error.__traceback__
        while tb is not None:
            if self._frames.is_user(tb.tb_frame.f_code):
                found = (tb.tb_frame, tb.tb_lineno)
            tb = tb.tb_next
        return found is not None and self._reader.at_fault(*found)


def _location(filename: str, line: int) -> SourceLocation:
    import linecache

    return SourceLocation(filename, line, linecache.getline(filename, line).strip())
