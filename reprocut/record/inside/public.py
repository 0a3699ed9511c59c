"""The public torch call in flight, found on the stack: light steps run without the function mode.

On a GPU the function mode (calls.py) is on for the first step and localized steps only: a Python
call per torch call costs too much on a launch-bound loop. In the other steps the public call an
asserting op runs under is the torch function the user's code called (the outermost torch frame
inside the innermost user frame, StackView.library), its arguments read from the frame's locals.
Under the function mode it is the outermost call on the run state's `public_stack`.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any

from reprocut.model.publicapi import public_name
from reprocut.record.inside.capture import HeldCall, TensorStore, hold_call
from reprocut.record.inside.frame_locals import local_values
from reprocut.record.inside.frames import StackView, UserFrames
from reprocut.record.inside.specs import on_cpu
from reprocut.record.inside.state import RunState


class PublicCalls:
    """Names public calls by their code object (resolving a dotted path costs) and holds their
    arguments as evidence."""

    def __init__(self, state: RunState, frames: UserFrames, store: TensorStore) -> None:
        self.state = state
        self.frames = frames
        self.store = store
        self._names: dict[CodeType, str | None] = {}

    def context(self, view: StackView | None = None) -> tuple[str | None, HeldCall | None]:
        """The outermost public call in flight, with its arguments captured (once).

        In backward there is none worth naming: `loss.backward()` is not what failed."""
        state = self.state
        if state.phase() == "backward":
            return None, None
        if not state.public_stack:
            if view is None:
                view = self.frames.view(sys._getframe(1))
            return self.from_frame(view.library if view.user else None)
        _func, name, args, kwargs = state.public_stack[0]
        key = id(state.public_stack[0])
        captured = state.public_captured.get(key)
        if captured is None and name is not None:
            captured = self.capture(name, args, kwargs)
            state.public_captured[key] = captured
        return name, captured

    def from_frame(self, library_frame: FrameType | None) -> tuple[str | None, HeldCall | None]:
        """The public call that `library_frame` runs, with its arguments captured."""
        if library_frame is None:
            return None, None
        code = library_frame.f_code
        if code in self._names:
            name = self._names[code]
        else:
            module = library_frame.f_globals.get("__name__", "")
            name = self._names[code] = _public_path(f"{module}.{code.co_name}")
        if name is None:
            return None, None
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        values = local_values(library_frame)
        args = tuple(values[n] for n in names[: code.co_argcount] if n in values)
        kwargs = {n: values[n] for n in names[code.co_argcount :] if n in values}
        return name, self.capture(name, args, kwargs, names)

    def capture(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        names: tuple[str, ...] | None = None,
    ) -> HeldCall:
        """On CPU every small input is kept; on CUDA the evidence goes to pinned memory, queued
        ahead of the kernels that may fault (shared with the op's own copies: TensorStore.add)."""
        cpu = on_cpu(args, kwargs)
        return hold_call(
            args, kwargs, name, self.store, everything=cpu, non_blocking=not cpu, names=names
        )


def _public_path(path: str) -> str | None:
    """`torch.nn.functional.embedding` if that dotted path names a public torch callable."""
    from reprocut.model.tensors import resolve

    try:
        return public_name(resolve(path))
    except (AttributeError, ValueError):
        return None
