"""Inside the user's process, at each public torch call: the call the user made, in flight.

`F.one_hot` never reaches the dispatcher as one op, so this function mode keeps the outermost
public call on the run state's `public_stack` (its arguments are captured only when an op asks:
public.py), tags the autograd node it made, and notes a culprit when the call itself raises, not
an aten op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from reprocut.model.publicapi import public_name
from reprocut.record.inside.public import PublicCalls
from reprocut.record.inside.records import Culprit
from reprocut.record.inside.specs import is_cuda_error
from reprocut.record.inside.state import RunState
from reprocut.record.inside.where import Where


class CallRecorder(TorchFunctionMode):
    """Public torch calls: keeps the outermost call in flight and tags autograd nodes."""

    def __init__(
        self,
        state: RunState,
        where: Where,
        public: PublicCalls,
        note_culprit: Callable[[Culprit], None],
        *,
        tag_operators: bool = False,
    ) -> None:
        super().__init__()
        self.state = state
        self.where = where
        self.public = public
        self.note_culprit = note_culprit
        # --nan with a localize window: operators (`a / b`) build autograd nodes to tag too
        self.tag_operators = tag_operators

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        state = self.state
        stack = state.public_stack
        outermost = not stack
        if outermost:
            name = public_name(func)
            if name is None or name.endswith(("__get__", "__set__")):
                result = func(*args, **kwargs)
                if self.tag_operators and state.localizing and name is None:
                    self.where.tag_autograd_node(result)
                return result
            entry = (func, name, args, kwargs)
            stack.append(entry)
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            if outermost and state.culprit is None and not is_cuda_error(exc):
                # raised by the public call itself, not by any aten op (CPU one_hot's check)
                name, captured = self.public.context()
                self.note_culprit(
                    self.where.culprit_here(public_call=name, public=captured, synchronized=True)
                )
            raise
        finally:
            if outermost:
                stack.pop()
                state.public_captured.pop(id(entry), None)
        if outermost and isinstance(result, torch.Tensor):
            self.where.tag_autograd_node(result)
        return result
