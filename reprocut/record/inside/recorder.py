"""Inside the user's process: see every aten op and public torch call, per training step.

A TorchDispatchMode sees aten ops (forward, backward, optimizer: ops.py); a TorchFunctionMode sees
the public call the user made (`F.one_hot` never reaches the dispatcher as one op: calls.py). The
Recorder owns both and the tripwire: global module hooks name modules, optimizer hooks mark step
boundaries. Each completed step is appended to trace.jsonl (identical steps as a back-reference),
so a crash loses at most the step in flight. child.py writes its snapshots and culprit
(records.py) to the run directory.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import _get_current_function_mode
from torch.utils._python_dispatch import _get_current_dispatch_mode

from reprocut.record.inside.calls import CallRecorder
from reprocut.record.inside.capture import ASSERTING_OPS, HeldCall, TensorStore
from reprocut.record.inside.finite_watch import OpWatch
from reprocut.record.inside.frames import StackView, UserFrames, module_calls
from reprocut.record.inside.host_ring import EventPool
from reprocut.record.inside.loops import LoopCounters
from reprocut.record.inside.modules import ModuleNames
from reprocut.record.inside.nonfinite import StepFlags, watch_backward
from reprocut.record.inside.ops import OpRecorder, spec_tuple
from reprocut.record.inside.outcome import report_early
from reprocut.record.inside.public import PublicCalls
from reprocut.record.inside.records import Culprit, Snapshot, StepState
from reprocut.record.inside.trace import TraceWriter
from reprocut.record.inside.tripwire import Tripwire

_TORCH_DIR = os.path.dirname(torch.__file__)


@dataclass
class RecorderConfig:
    run_dir: Path
    localize_from: int | None = None  # localize mode: synchronize around ops of these steps
    localize_to: int | None = None
    snapshots: bool = True  # record mode on CUDA: copy asserting ops' evidence as we go
    tag_backward: bool = True  # tag autograd nodes with their forward line and module
    # Light steps see only the asserting ops (see Recorder.wants_every_op): None = on GPU runs
    light_steps: bool | None = None
    # --nan: a non-finite flag per step (nonfinite.py); with a localize window, finite checks
    # around every op of it (finite_watch.py) instead of synchronizing and capturing
    nan: bool = False


class Recorder:
    """Owns the modes and hooks; collects the trace and, on failure, the culprit."""

    def __init__(self, config: RecorderConfig) -> None:
        self.config = config
        self.state = StepState()
        self.frames = UserFrames()
        self.loops = LoopCounters(self.frames)
        self.trace = TraceWriter(config.run_dir / "trace.jsonl")
        self.store = TensorStore()
        self.ops: list[tuple[Any, ...]] = []
        self.snapshots: list[Snapshot] = []
        self.culprit: Culprit | None = None
        self.public_stack: list[tuple[Any, str | None, tuple[Any, ...], dict[str, Any]]] = []
        self.public_captured: dict[int, HeldCall] = {}
        self.public_calls = PublicCalls(self.store)  # found on the stack in light steps
        self.module_names = ModuleNames()
        self.localizing = self._in_localize_window(0)  # derived at each step boundary
        # steps not yet known complete: (step, (device, its event), its snapshots)
        self.pending: list[tuple[int, tuple[int, Any], list[Snapshot]]] = []
        self._events = EventPool()  # events of completed steps, recorded again
        self.healthy_through = -1  # last step whose kernels are known to have completed
        self._pid = os.getpid()
        self.seq = 0
        self.last_op: str | None = None
        self._main_thread = threading.get_ident()
        self._handles: list[Any] = []
        self._module_hooks: list[Any] = []  # none in light steps that find modules on the stack
        # The function mode costs a Python call per torch call: GPU runs keep it for the first
        # step and localized steps only (public calls are then found on the stack).
        self._function_mode = _ModeSwitch(CallRecorder(self), _get_current_function_mode)
        # Every op under the dispatch mode, or light steps (see wants_every_op).
        self._dispatch_mode = _ModeSwitch(OpRecorder(self), _get_current_dispatch_mode)
        self.tripwire: Tripwire | None = None
        self._asserting_key: int | None = None  # the asserting ops' layouts in the last step
        self._original_optimizer_init: Any = None
        self._original_function_apply: Any = None
        self.flags = StepFlags() if config.nan else None
        self.op_watch = OpWatch(self) if config.nan and config.localize_from is not None else None
        self._original_backward: Any = None

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        from torch.optim import optimizer as optimizer_hooks

        self._set_module_hooks(True)
        self._handles = [
            optimizer_hooks.register_optimizer_step_pre_hook(self._on_optimizer_enter),
            optimizer_hooks.register_optimizer_step_post_hook(self._on_optimizer_exit),
        ]
        recorder = self
        original = torch.optim.Optimizer.__init__
        self._original_optimizer_init = original

        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            recorder.state.optimizer_seen = True
            original(optimizer, *args, **kwargs)

        torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]

        # Custom autograd Functions: their backward runs outside any module or user frame, so
        # the node is tagged at apply() with the forward line and module.
        apply = torch.autograd.Function.apply
        self._original_function_apply = apply

        def tagged_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            result = apply.__func__(cls, *args, **kwargs)
            recorder.tag_autograd_node(result)
            return result

        torch.autograd.Function.apply = classmethod(tagged_apply)  # type: ignore[method-assign,assignment]
        if self.flags is not None:  # the losses handed to backward
            self._original_backward = watch_backward(self.flags)
        try:
            self.tripwire = Tripwire(
                ASSERTING_OPS, self._dispatch_mode.mode.on_asserting_call
            ).__enter__()
        except Exception:  # a torch without Python kernels at that key: every step sees every op
            self.tripwire = None
        self._function_mode.set(True)
        self._dispatch_mode.set(True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._original_optimizer_init is None:
            return
        with contextlib.suppress(Exception):  # the stack may be unwound by the exception
            self._dispatch_mode.set(False)
        with contextlib.suppress(Exception):
            self._function_mode.set(False)
        if self.tripwire is not None:
            self.tripwire.close()
        self._set_module_hooks(False)
        for handle in self._handles:
            handle.remove()
        torch.optim.Optimizer.__init__ = self._original_optimizer_init  # type: ignore[method-assign]
        torch.autograd.Function.apply = self._original_function_apply  # type: ignore[method-assign]
        if self._original_backward is not None:
            torch.autograd.backward = self._original_backward
        self._original_optimizer_init = None
        self.trace.close()

    def tag_autograd_node(
        self, output: Any, *, locate: bool = True, overwrite: bool = True
    ) -> None:
        """Let backward ops of the node that made `output` know its forward line and module:
        in backward no user frame and no module is on the stack."""
        if not (self.config.tag_backward and torch.is_grad_enabled()):
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

    # --- steps, phases, modules ----------------------------------------------------------------

    def _end_step(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked DataLoader worker: the parent owns the trace
        every_op, healthy = self._dispatch_mode.active, self.healthy_through
        self.trace.write_step(self.state.step, self.ops, every_op=every_op, healthy_through=healthy)
        asserting_key = hash(tuple(op for op in self.ops if op[0] in ASSERTING_OPS))
        layout_changed = asserting_key != self._asserting_key
        self._asserting_key = asserting_key
        self.ops = []
        if torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            event = self._events.take(device)
            event.record()
            self.pending.append((self.state.step, (device, event), self.snapshots))
            self._retire_completed_steps()
        self.snapshots = []
        self.store.forget_queued()
        ended = self.state.step
        self.state.step += 1
        self.localizing = self._in_localize_window(self.state.step)
        self._function_mode.set(not torch.cuda.is_initialized() or self.localizing)
        self._dispatch_mode.set(self.wants_every_op(self.state.step, layout_changed))
        self._set_module_hooks(not self._finds_modules_on_stack())
        if self.flags is not None:  # --nan: may stop the run (NonfiniteStop)
            config = self.config
            if self.op_watch is None:
                self.flags.end_step(ended)
            else:
                self.flags.end_localized_step(ended, config.localize_from, config.localize_to)

    def wants_every_op(self, step: int, layout_changed: bool) -> bool:
        """Whether `step` runs under the dispatch mode (every op recorded) or is a light step.

        Being under a Python dispatch mode costs ~1.8x on a launch-bound loop however little
        the mode does, so GPU runs record every op only in the first steps, at powers of two,
        after the asserting ops' layouts changed, and in localized steps. In light steps the
        tripwire still sees every asserting op: its specs and snapshots are never sampled.
        """
        if self.localizing or self.tripwire is None:
            return True
        light = self.config.light_steps
        if light is None:
            light = torch.cuda.is_initialized()
        if not light:
            return True
        return step < 3 or step & (step - 1) == 0 or layout_changed

    @property
    def light_step(self) -> bool:
        """The current step records only the asserting ops."""
        return not self._dispatch_mode.active

    def record_op(self, name: str, args: tuple[Any, ...], phase: str | None = None) -> None:
        """Add an op of the current step to the trace (the dispatch mode's hot path inlines
        this: a method call per op is measurable there)."""
        stack = self.state.module_stack
        phase = phase or self.state.phase()
        self.ops.append((name, stack[-1] if stack else None, phase, tuple(map(spec_tuple, args))))

    def _retire_completed_steps(self) -> None:
        """Drop snapshots of steps whose kernels all finished: they cannot hold the fault.

        CUDA errors surface late, possibly steps later (at a logging `.item()`), so snapshots
        live until an event recorded after their step reports completion.
        """
        while self.pending:
            step, (device, event), snapshots = self.pending[0]
            try:
                done = event.query()
            except Exception:
                return  # a sticky error: it will surface in the user's code, keep everything
            if not done:
                return
            self.healthy_through = step
            self.pending.pop(0)
            self._events.give_back(device, event)
            if self.culprit is None:  # else a public call's copies may be the culprit's too
                for snapshot in snapshots:
                    self.store.drop(snapshot.captured_keys())

    def all_snapshots(self) -> list[Snapshot]:
        """Snapshots of every step not yet known to have completed, oldest first."""
        return [s for _, _, snapshots in self.pending for s in snapshots] + self.snapshots

    def _on_optimizer_enter(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        self.state.optimizer_seen = True
        self.state.in_optimizer += 1
        if self.flags is not None and self.state.in_optimizer == 1:
            self.flags.enter_optimizer(optimizer)
        return _closure_outside_optimizer(self.state, args, kwargs)

    def _on_optimizer_exit(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.state.in_optimizer -= 1
        if self.flags is not None and self.state.in_optimizer == 0:
            self.flags.watch_optimizer(optimizer)
        if self.state.in_optimizer == 0:
            self._end_step()

    def _on_module_enter(self, module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() != self._main_thread:
            return
        if not self.state.module_stack and not self.state.optimizer_seen:
            # no optimizer: each top-level forward starts a step (an evaluation batch)
            if self.state.root_forwards:
                self._end_step()
            self.state.root_forwards += 1
        self.state.module_stack.append(self.module_names.enter(module))

    def _on_module_exit(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self._main_thread or not self.state.module_stack:
            return
        if isinstance(output, torch.Tensor):
            # the module's last node (a custom autograd.Function, say) learns this module:
            # tagged before the pop, while it is the current one
            self.tag_autograd_node(output, locate=False, overwrite=False)
        self.state.module_stack.pop()
        self.module_names.exit()
        if self.flags is not None and not self.state.module_stack:
            self.flags.watch_output(output)

    def _set_module_hooks(self, on: bool) -> None:
        from torch.nn.modules import module as module_hooks

        if on and not self._module_hooks:
            self._module_hooks = [
                module_hooks.register_module_forward_pre_hook(self._on_module_enter),
                module_hooks.register_module_forward_hook(self._on_module_exit, always_call=True),
            ]
        elif not on:
            for handle in self._module_hooks:
                handle.remove()
            self._module_hooks = []

    def _finds_modules_on_stack(self) -> bool:
        """Light steps of a training loop run without module hooks: global hooks cost every
        module call ~3 us in torch and as much in ours (a launch-bound step makes dozens), while
        only the asserting ops need their module, found then on the stack (current_module).
        Not where the hooks mark steps (no optimizer) or --nan watches outputs (no loss yet)."""
        state = self.state
        return (
            self.light_step
            and state.optimizer_seen
            and not state.module_stack
            and (self.flags is None or self.flags.losses_seen)
        )

    def current_module(self, view: StackView | None = None) -> str | None:
        """The path of the module being called (that of `view`, if given)."""
        if not self._module_hooks:  # light steps: the module calls on the stack
            calls = view.modules if view is not None else module_calls(sys._getframe(1))
            return self.module_names.innermost(calls)
        return self.state.module_stack[-1] if self.state.module_stack else None

    # --- failures ------------------------------------------------------------------------------

    def note_culprit(self, culprit: Culprit) -> None:
        if self.culprit is None:
            self.culprit = culprit
            report_early(self, sys.exc_info()[1])  # called while its error is being handled

    def note_culprit_here(
        self,
        *,
        synchronized: bool,
        public_call: str | None = None,
        public: HeldCall | None = None,
    ) -> None:
        """A failure that no aten op owns: a composite public call's own check, or a fault
        pending before an op (a kernel outside the dispatcher), placed at the current line."""
        self.note_culprit(
            Culprit(
                op=None,
                target=None,
                call=None,
                step=self.state.step,
                phase=self.state.phase(),
                module=self.current_module(),
                source=self.frames.find(sys._getframe(2)),
                forward_source=None,
                public_call=public_call,
                public=None if public is None else public.to_json(),
                synchronized=synchronized,
                call_site=self.frames.call_site(sys._getframe(2)),
                loop=self.loops.read(sys._getframe(2)),
            )
        )

    def public_context(self, view: StackView | None = None) -> tuple[str | None, HeldCall | None]:
        """The outermost public call in flight, with its arguments captured (once).

        In backward there is none worth naming: `loss.backward()` is not what failed."""
        if self.state.phase() == "backward":
            return None, None
        if not self.public_stack:
            if view is None:
                view = self.frames.view(sys._getframe(1))
            return self.public_calls.from_frame(view.library if view.user else None)
        _func, name, args, kwargs = self.public_stack[0]
        key = id(self.public_stack[0])
        captured = self.public_captured.get(key)
        if captured is None and name is not None:
            captured = self.public_calls.capture(name, args, kwargs)
            self.public_captured[key] = captured
        return name, captured

    def _in_localize_window(self, step: int) -> bool:
        config = self.config
        return config.localize_from is not None and config.localize_from <= step <= (
            config.localize_to if config.localize_to is not None else step
        )


def _closure_outside_optimizer(state: StepState, args: Any, kwargs: Any) -> Any:
    """`optimizer.step(closure)` with the closure run as the user's code: Lightning runs
    `training_step` (forward and backward) inside the closure, and LBFGS calls it repeatedly.
    Returns the hook's replacement (args, kwargs), or None when there is no closure. `args`
    holds the optimizer itself first."""
    if kwargs.get("closure") is not None:
        closure = kwargs["closure"]
    elif len(args) > 1 and callable(args[1]):
        closure = args[1]
    else:
        return None

    def run_closure(*closure_args: Any, **closure_kwargs: Any) -> Any:
        depth, state.in_optimizer = state.in_optimizer, 0
        try:
            return closure(*closure_args, **closure_kwargs)
        finally:
            state.in_optimizer = depth

    if kwargs.get("closure") is not None:
        return args, {**kwargs, "closure": run_closure}
    return (args[0], run_closure, *args[2:]), kwargs


class _ModeSwitch:
    """A torch mode turned on and off at step boundaries. It is taken off the mode stack only
    while it is on top: the user's own mode may have been pushed above it."""

    def __init__(self, mode: Any, current: Any) -> None:
        self.mode = mode
        self._current = current  # the mode now on top of that stack
        self.active = False

    def set(self, active: bool) -> None:
        if active == self.active:
            return
        if active:
            self.mode.__enter__()
        else:
            if self._current() is not self.mode:
                return
            self.mode.__exit__(None, None, None)
        self.active = active
