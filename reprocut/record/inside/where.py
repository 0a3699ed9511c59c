"""Where the script is at an op: the user's line, the module being called, the loop counters.

The hooks ask this at the ops that matter (asserting ops, the culprit, a non-finite origin);
it reads the stack (frames.py, loops.py, modules.py) and the run's state (state.py). Autograd
nodes are tagged here with their forward line and module, since in backward no user frame and no
module is on the stack.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from reprocut.record.inside.capture import HeldCall
from reprocut.record.inside.frames import StackView, UserFrames, module_calls
from reprocut.record.inside.loops import LoopCounters
from reprocut.record.inside.modules import ModuleNames
from reprocut.record.inside.records import Culprit
from reprocut.record.inside.state import RunState


class Where:
    """The user's frames, loop counters and module names, read against the run's state."""

    def __init__(
        self,
        state: RunState,
        frames: UserFrames,
        loops: LoopCounters,
        module_names: ModuleNames,
        *,
        tag_backward: bool = True,
    ) -> None:
        self.state = state
        self.frames = frames
        self.loops = loops
        self.module_names = module_names
        self.tag_backward = tag_backward  # tag autograd nodes with their forward line and module

    def current_module(self, view: StackView | None = None) -> str | None:
        """The path of the module being called (that of `view`, if given)."""
        if not self.state.module_hooks:  # light steps: the module calls on the stack
            calls = view.modules if view is not None else module_calls(sys._getframe(1))
            return self.module_names.innermost(calls)
        stack = self.state.module_stack
        return stack[-1] if stack else None

    def tag_autograd_node(
        self, output: Any, *, locate: bool = True, overwrite: bool = True
    ) -> None:
        """Let backward ops of the node that made `output` know its forward line and module:
        in backward no user frame and no module is on the stack."""
        if not (self.tag_backward and torch.is_grad_enabled()):
            return
        for tensor in output if isinstance(output, (tuple, list)) else (output,):
            if not (isinstance(tensor, torch.Tensor) and tensor.requires_grad):
                continue
            try:
                grad_fn = tensor.grad_fn
            except RuntimeError:  # views modified in place refuse even to be asked
                continue
            if grad_fn is None or (not overwrite and "reprocut" in grad_fn.metadata):
                continue
            location = self.frames.here() if locate else None
            call_site = self.frames.call_site(sys._getframe(1)) if locate else None
            grad_fn.metadata["reprocut"] = (location, self.current_module(), call_site)

    def culprit_here(
        self,
        *,
        synchronized: bool,
        public_call: str | None = None,
        public: HeldCall | None = None,
    ) -> Culprit:
        """A failure that no aten op owns: a composite public call's own check, or a fault
        pending before an op (a kernel outside the dispatcher), placed at the line of the
        caller's caller."""
        state = self.state
        return Culprit(
            op=None,
            target=None,
            call=None,
            step=state.step,
            phase=state.phase(),
            module=self.current_module(),
            source=self.frames.find(sys._getframe(2)),
            forward_source=None,
            public_call=public_call,
            public=None if public is None else public.to_json(),
            synchronized=synchronized,
            call_site=self.frames.call_site(sys._getframe(2)),
            loop=self.loops.read(sys._getframe(2)),
            after_loop=self.loops.training.after_frame(sys._getframe(2)),
            test_line=state.test_line(sys._getframe(2)),
        )


def autograd_tag() -> tuple[Any, ...] | None:
    """The (forward line, module, call site) tag of the autograd node running now, if any:
    in backward the only way to the forward line, no user frame being on the stack."""
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    return node.metadata.get("reprocut")
