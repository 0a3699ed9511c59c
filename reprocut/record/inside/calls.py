"""Inside the user's process, at each public torch call: the call the user made, in flight.

`F.one_hot` never reaches the dispatcher as one op, so this function mode keeps the outermost
public call on the Recorder's `public_stack` (its arguments are captured only when an op asks),
tags the autograd node it made, and notes a culprit when the call itself raises, not an aten op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from reprocut.model.publicapi import public_name
from reprocut.record.inside.ops import is_cuda_error

if TYPE_CHECKING:
    from reprocut.record.inside.recorder import Recorder


class CallRecorder(TorchFunctionMode):
    """Public torch calls: keeps the outermost call in flight and tags autograd nodes."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        recorder = self.recorder
        stack = recorder.public_stack
        outermost = not stack
        if outermost:
            name = public_name(func)
            if name is None or name.endswith(("__get__", "__set__")):
                result = func(*args, **kwargs)
                if recorder.op_watch is not None and recorder.localizing and name is None:
                    recorder.tag_autograd_node(result)  # --nan: operators (`a / b`) build nodes too
                return result
            entry = (func, name, args, kwargs)
            stack.append(entry)
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            if outermost and recorder.culprit is None and not is_cuda_error(exc):
                # raised by the public call itself, not by any aten op (CPU one_hot's check)
                name, captured = recorder.public_context()
                recorder.note_culprit_here(public_call=name, public=captured, synchronized=True)
            raise
        finally:
            if outermost:
                stack.pop()
                recorder.public_captured.pop(id(entry), None)
        if outermost and isinstance(result, torch.Tensor):
            recorder.tag_autograd_node(result)
        return result
