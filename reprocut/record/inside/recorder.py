"""Inside the user's process: see every aten op and public torch call, per training step.

A TorchDispatchMode sees aten ops (forward, backward, optimizer: ops.py); a TorchFunctionMode sees
the public call the user made (`F.one_hot` never reaches the dispatcher as one op: calls.py). The
Recorder composes both and the tripwire: it builds them around one RunState (state.py) and hands
each what it needs (where the script is: where.py; the public call in flight: public.py; the
culprit's early outcome: outcome.py), so no hook holds the Recorder. Its own hooks mark step
boundaries (optimizer hooks) and keep the module stack (global module hooks). Each completed step
is appended to trace.jsonl (identical steps as a back-reference), so a crash loses at most the
step in flight. child.py writes its snapshots and culprit (records.py) to the run directory.
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
from reprocut.record.inside.capture import ASSERTING_OPS, TensorStore
from reprocut.record.inside.finite_watch import OpWatch
from reprocut.record.inside.frames import UserFrames
from reprocut.record.inside.host_ring import EventPool
from reprocut.record.inside.loops import LoopCounters
from reprocut.record.inside.modules import ModuleNames
from reprocut.record.inside.nonfinite import StepFlags, watch_backward
from reprocut.record.inside.ops import OpRecorder
from reprocut.record.inside.optimizer_steps import closure_outside_optimizer, from_torch
from reprocut.record.inside.outcome import EarlyOutcome
from reprocut.record.inside.public import PublicCalls
from reprocut.record.inside.raise_watch import RaiseWatch
from reprocut.record.inside.state import RunState
from reprocut.record.inside.trace import TraceWriter
from reprocut.record.inside.tripwire import Tripwire
from reprocut.record.inside.where import Where


@dataclass
class RecorderConfig:
    run_dir: Path
    localize_from: int | None = None  # localize mode: synchronize around ops of these steps
    localize_to: int | None = None
    snapshots: bool = True  # record mode on CUDA: copy asserting ops' evidence as we go
    tag_backward: bool = True  # tag autograd nodes with their forward line and module
    # Light steps (see Recorder.wants_every_op): None (the default) or True = light steps;
    # False = every op of every step (--full-trace, the memory watch)
    light_steps: bool | None = None
    # --nan: a non-finite flag per step (nonfinite.py); with a localize window, finite checks
    # around every op of it (finite_watch.py) instead of synchronizing and capturing
    nan: bool = False


class Recorder:
    """Composes the modes and hooks around one RunState; collects the trace and, on failure,
    the culprit (in `state`)."""

    def __init__(self, config: RecorderConfig) -> None:
        self.config = config
        state = self.state = RunState()
        state.localizing = self._in_localize_window(0)  # derived at each step boundary
        self.frames = UserFrames()
        self.loops = LoopCounters(self.frames)
        self.module_names = ModuleNames()
        self.where = Where(
            state, self.frames, self.loops, self.module_names, tag_backward=config.tag_backward
        )
        self.trace = TraceWriter(config.run_dir / "trace.jsonl")
        self.store = TensorStore()
        self.public_calls = PublicCalls(state, self.frames, self.store)
        self.early = EarlyOutcome(state, self.store, config.run_dir, enabled=not config.nan)
        self._events = EventPool()  # events of completed steps, recorded again
        self._pid = os.getpid()
        self._main_thread = threading.get_ident()
        self._handles: list[Any] = []
        self._module_hooks: list[Any] = []  # none in light steps that find modules on the stack
        self.flags = StepFlags() if config.nan else None
        self.op_watch = (
            OpWatch(state, self.where, self.store)
            if config.nan and config.localize_from is not None
            else None
        )
        note_culprit = self.early.note_culprit
        # The function mode costs a Python call per torch call: GPU runs keep it for the first
        # step and localized steps only (public calls are then found on the stack).
        calls = CallRecorder(
            state,
            self.where,
            self.public_calls,
            note_culprit,
            tag_operators=self.op_watch is not None,
        )
        self._function_mode = _ModeSwitch(calls, _get_current_function_mode)
        # Every op under the dispatch mode, or light steps (see wants_every_op).
        ops = OpRecorder(
            state,
            self.where,
            self.public_calls,
            self.store,
            note_culprit,
            snapshots=config.snapshots,
            tag_backward=config.tag_backward,
            op_watch=self.op_watch,
        )
        self._dispatch_mode = _ModeSwitch(ops, _get_current_dispatch_mode)
        # CPU light steps: a try around each torch call, the raising one watched again
        raises = RaiseWatch(state, calls, self.public_calls, self.early, self._set_every_op)
        self._raise_watch = _ModeSwitch(raises, _get_current_function_mode)
        self.tripwire: Tripwire | None = None
        self._asserting_key: int | None = None  # the asserting ops' layouts in the last step
        self._layouts_recorded = True  # this step records its asserting ops' layouts
        self._original_optimizer_init: Any = None
        self._original_function_apply: Any = None
        self._original_backward: Any = None
        # called with each step's number as it ends (`record --memory`: memory per step)
        self.step_listeners: list[Any] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        from torch.optim import optimizer as optimizer_hooks

        self._set_module_hooks(True)
        self._handles = [
            optimizer_hooks.register_optimizer_step_pre_hook(self._on_optimizer_enter),
            optimizer_hooks.register_optimizer_step_post_hook(self._on_optimizer_exit),
        ]
        state = self.state
        original = torch.optim.Optimizer.__init__
        self._original_optimizer_init = original

        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            state.optimizer_seen = True
            original(optimizer, *args, **kwargs)

        torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]

        # Custom autograd Functions: their backward runs outside any module or user frame, so
        # the node is tagged at apply() with the forward line and module.
        apply = torch.autograd.Function.apply
        # the descriptor itself (a classmethod): put back, the bound method would call every
        # Function's apply with cls=Function (NotImplementedError: forward) after record ends
        self._original_function_apply = torch.autograd.Function.__dict__.get("apply")

        where = self.where

        def tagged_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            result = apply.__func__(cls, *args, **kwargs)
            where.tag_autograd_node(result)
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
        self._dispatch_mode.mode.tripwire_on = self.tripwire is not None
        self._set_every_op(True)
        self._set_function_mode()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._original_optimizer_init is None:
            return
        with contextlib.suppress(Exception):  # the stack may be unwound by the exception
            self._set_every_op(False)
        with contextlib.suppress(Exception):
            self._raise_watch.set(False)
        with contextlib.suppress(Exception):
            self._function_mode.set(False)
        if self.tripwire is not None:
            self.tripwire.close()
        self._set_module_hooks(False)
        for handle in self._handles:
            handle.remove()
        torch.optim.Optimizer.__init__ = self._original_optimizer_init  # type: ignore[method-assign]
        if self._original_function_apply is None:  # apply was inherited: uncover it again
            del torch.autograd.Function.apply
        else:
            torch.autograd.Function.apply = self._original_function_apply  # type: ignore[method-assign]
        if self._original_backward is not None:
            torch.autograd.backward = self._original_backward
        self._original_optimizer_init = None
        self.trace.close()

    # --- steps, phases, modules ----------------------------------------------------------------

    def _end_step(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked DataLoader worker: the parent owns the trace
        state = self.state
        every_op, healthy = self._dispatch_mode.active, state.healthy_through
        self.trace.write_step(state.step, state.ops, every_op=every_op, healthy_through=healthy)
        layout_changed = False
        if self._layouts_recorded:  # not in a CPU light step, which records no op
            asserting_key = hash(tuple(op for op in state.ops if op[0] in ASSERTING_OPS))
            layout_changed = asserting_key != self._asserting_key
            self._asserting_key = asserting_key
        state.ops = []
        if torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            event = self._events.take(device)
            event.record()
            state.pending.append((state.step, (device, event), state.snapshots))
            self._retire_completed_steps()
        state.snapshots = []
        self.store.forget_queued()
        ended = state.step
        state.step += 1
        for listener in self.step_listeners:
            listener(ended)
        state.localizing = self._in_localize_window(state.step)
        self._set_every_op(self.wants_every_op(state.step, layout_changed))
        self._set_function_mode()
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
        the mode does (6x on a small CPU model), so runs record every op only in the first
        steps, at powers of two, after the asserting ops' layouts changed, and in localized
        steps. In light steps the tripwire still sees every asserting op: its specs and
        snapshots are never sampled; on CPU the raise watch sees the call that raises.
        """
        if self.state.localizing or self.tripwire is None or self.config.light_steps is False:
            return True
        return step < 3 or step & (step - 1) == 0 or layout_changed

    def _set_function_mode(self) -> None:
        """The function mode of the step now starting: the public-call mode (calls.py), the
        raise watch (raise_watch.py) or neither. The public-call mode tags autograd nodes with
        their forward lines and costs a launch-bound loop more than the dispatch mode alone, so
        it runs where every op is recorded: localized steps, runs that see every op of every
        step (--full-trace, the memory watch), and a CPU run's sampled steps. A CPU run's light
        steps have the raise watch instead: an op raises where it fails there, so the call that
        raised is watched again. A GPU run's light steps have neither: its errors surface late,
        and snapshots and reruns find the op (localize/)."""
        state = self.state
        if state.localizing or self.config.light_steps is False:
            wanted = "calls"
        elif torch.cuda.is_initialized():
            wanted = None
        else:
            wanted = "raises" if state.light_step else "calls"
        if wanted != "raises":
            self._raise_watch.set(False)
        self._function_mode.set(wanted == "calls")
        # not above a mode of the script's own that keeps the public-call mode below it
        self._raise_watch.set(wanted == "raises" and not self._function_mode.active)
        state.raise_watched = self._raise_watch.active
        self._layouts_recorded = not (state.light_step and state.raise_watched)

    @property
    def light_step(self) -> bool:
        """The current step records only the asserting ops."""
        return self.state.light_step

    def _set_every_op(self, active: bool) -> None:
        """The dispatch mode on (every op recorded) or off (a light step), the state told."""
        try:
            self._dispatch_mode.set(active)
        finally:
            self.state.light_step = not self._dispatch_mode.active

    def _retire_completed_steps(self) -> None:
        """Drop snapshots of steps whose kernels all finished: they cannot hold the fault.

        CUDA errors surface late, possibly steps later (at a logging `.item()`), so snapshots
        live until an event recorded after their step reports completion.
        """
        state = self.state
        while state.pending:
            step, (device, event), snapshots = state.pending[0]
            try:
                done = event.query()
            except Exception:
                return  # a sticky error: it will surface in the user's code, keep everything
            if not done:
                return
            state.healthy_through = step
            state.pending.pop(0)
            self._events.give_back(device, event)
            if state.culprit is None:  # else a public call's copies may be the culprit's too
                for snapshot in snapshots:
                    self.store.drop(snapshot.captured_keys())

    def _on_optimizer_enter(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        state = self.state
        state.optimizer_seen = True
        state.in_optimizer += 1
        if self.flags is not None and state.in_optimizer == 1:
            self.flags.enter_optimizer(optimizer)
        watch = None
        if state.in_optimizer == 1 and state.raise_watched and from_torch(optimizer):
            # torch's own optimizers make ~15 torch calls per parameter per step on CPU, each
            # a Python call under the raise watch: their step runs unwatched (an error there
            # is then found by a rerun of the step), the user's closure watched
            watch = self._watch_raises
            watch(False)
        return closure_outside_optimizer(state, args, kwargs, watch)

    def note_unwatched_raise(self, exc: BaseException) -> None:
        """The run ends in `exc`: in a CPU light step, one that may come from an op the raise
        watch never saw (TorchScript, say) leaves the step to a rerun (RaiseWatch.missed)."""
        watch = self._raise_watch
        if self.state.light_step and watch.active and watch.mode.missed(exc):
            self.state.raise_missed = True

    def _watch_raises(self, on: bool) -> None:
        self._raise_watch.set(on)
        self.state.raise_watched = self._raise_watch.active

    def _on_optimizer_exit(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.state.in_optimizer -= 1
        if self.flags is not None and self.state.in_optimizer == 0:
            self.flags.watch_optimizer(optimizer)
        if self.state.in_optimizer == 0:
            self.loops.training.note_step(sys._getframe(1))  # where the training loop is
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
            self.where.tag_autograd_node(output, locate=False, overwrite=False)
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
        self.state.module_hooks = bool(self._module_hooks)

    def _finds_modules_on_stack(self) -> bool:
        """Light steps of a training loop run without module hooks: global hooks cost every
        module call ~3 us in torch and as much in ours (a launch-bound step makes dozens), while
        only the asserting ops need their module, found then on the stack (Where.current_module).
        Not where the hooks mark steps (no optimizer) or --nan watches outputs (no loss yet)."""
        state = self.state
        return (
            self.light_step
            and state.optimizer_seen
            and not state.module_stack
            and (self.flags is None or self.flags.losses_seen)
        )

    def _in_localize_window(self, step: int) -> bool:
        config = self.config
        return config.localize_from is not None and config.localize_from <= step <= (
            config.localize_to if config.localize_to is not None else step
        )


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
