"""Inside the user's process, at each aten op: record its specs, snapshot or capture its inputs.

The Recorder (recorder.py) turns this dispatch mode on for the steps that record every op, and
hands `on_asserting_call` to the tripwire, which sees the asserting ops of every step. What an op
leaves goes to the run's state (state.py): its specs to the step's ops, Snapshots, and at most
one Culprit, noted through the callable the Recorder hands in (outcome.py writes it at once).

Three ways to meet a failing op, by mode:
- record (CPU): the op raises synchronously, so it is the culprit; its inputs are still intact.
- record (CUDA): asserting ops get their evidence copied to pinned memory before they run
  (snapshots); on failure the parent replays them one by one to find the culprit.
- localize (a rerun): at the failing step, synchronize before and after every op and copy inputs
  first, so the op that raises is the culprit and its inputs are real.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reprocut.model.case import SourceLocation
from reprocut.model.publicapi import aten_name, aten_path
from reprocut.record.inside.capture import ASSERTING_OPS, TensorStore, capture_call, hold_call
from reprocut.record.inside.finite_watch import OpWatch
from reprocut.record.inside.public import PublicCalls
from reprocut.record.inside.records import Culprit, Snapshot
from reprocut.record.inside.specs import held_spec, is_cuda_error, on_cpu, spec_tuple
from reprocut.record.inside.state import RunState
from reprocut.record.inside.where import Where, autograd_tag


class OpRecorder(TorchDispatchMode):
    """Aten ops: record specs; snapshot or synchronize where the mode asks for it."""

    def __init__(
        self,
        state: RunState,
        where: Where,
        public: PublicCalls,
        store: TensorStore,
        note_culprit: Callable[[Culprit], None],
        *,
        snapshots: bool = True,
        tag_backward: bool = True,
        op_watch: OpWatch | None = None,
    ) -> None:
        super().__init__()
        self.state = state
        self.where = where
        self.public = public
        self.store = store
        self.note_culprit = note_culprit
        self.snapshots = snapshots  # copy asserting ops' evidence as they run (CUDA)
        self.tag_backward = tag_backward
        self.op_watch = op_watch  # --nan with a localize window: finite checks per op
        self.tripwire_on = False  # the tripwire sees the asserting ops: none is watched here
        # by id(op): hashing an OpOverload runs Python code. The op itself is kept in the
        # entry, so its id cannot be reused.
        self._ops: dict[int, tuple[str, bool, Any]] = {}
        self._targets: dict[int, tuple[str, tuple[str, ...] | None, Any]] = {}
        self._untagged: list[tuple[int, Any, tuple[Any, ...]]] = []  # see _tag_later

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No dynamo-disabling wrapper around every op: it costs as much as recording the op,
        and nothing is compiled under reprocut (child.py runs torch.compile eagerly and sets
        TORCH_COMPILE_DISABLE)."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # The hot path: a healthy op outside the localize window costs one dict lookup, the
        # op, and its specs. Everything else (asserting ops, localized steps) goes the long way.
        state = self.state
        entry = self._ops.get(id(func))
        if entry is None:
            entry = self._learn(func)
        name = entry[0]
        state.last_op = name
        if state.localizing or entry[1]:
            return self._dispatch_watched(func, name, args, kwargs or {})
        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:
            self._raised(func, name, args, kwargs or {}, exc, None, synchronizing=False)
            raise
        stack = state.module_stack
        state.ops.append(
            (
                name,
                stack[-1] if stack else None,
                state.phase(),
                tuple(map(spec_tuple, args)),
            )
        )
        return result

    def _learn(self, func: Any) -> tuple[str, bool, Any]:
        """Name a new op, and whether it takes the long way (snapshots of asserting ops)."""
        name = aten_name(func)
        # with the tripwire in, it snapshots asserting ops (above this mode, in every step)
        watched = self.snapshots and not self.tripwire_on and name in ASSERTING_OPS
        entry = self._ops[id(func)] = (name, watched, func)
        return entry

    def _dispatch_watched(self, func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> Any:
        """An op that may need its inputs copied first: snapshots, or a localized step."""
        localizing = self.state.localizing
        if localizing and self.op_watch is not None:  # --nan: finite checks
            return self.op_watch.dispatch(self, func, name, args, kwargs)
        call = None
        synchronizing = localizing and torch.cuda.is_initialized()
        if synchronizing:
            # every op, CUDA arguments or not: a host-to-device copy also raises pending faults
            self._synchronize_before(func, name)
            self.public.context()  # copy the public call's inputs before any fault
            call = self._capture(func, name, args, kwargs)
        elif self.snapshots and name in ASSERTING_OPS and _touches_cuda(args, kwargs):
            self._snapshot(func, name, args, kwargs)
        try:
            result = func(*args, **kwargs)
            if synchronizing:
                torch.cuda.synchronize()
        except Exception as exc:
            self._raised(func, name, args, kwargs, exc, call, synchronizing=synchronizing)
            raise
        self.record_op(name, args)
        return result

    def record_op(self, name: str, args: tuple[Any, ...], phase: str | None = None) -> None:
        """Add an op of the current step to the state's ops (the hot path above inlines this:
        a method call per op is measurable there)."""
        state = self.state
        stack = state.module_stack
        phase = phase or state.phase()
        state.ops.append((name, stack[-1] if stack else None, phase, tuple(map(spec_tuple, args))))

    def on_asserting_call(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Any
    ) -> Any:
        """The tripwire's handler: snapshot the evidence; in light steps also record the op and
        own its synchronous error (under the dispatch mode, the mode does both). A CPU run's
        light step records nothing here: its errors are raised where they happen, and this
        handler only notes the op's own for the raise watch (raise_watch.py)."""
        state = self.state
        if state.raise_watched and state.light_step:
            try:
                return run()
            except Exception as exc:
                self._raised_light(func, args, kwargs, exc)
                raise
        entry = self._ops.get(id(func)) or self._learn(func)
        name = entry[0]
        if state.localizing:
            return run()  # the mode synchronizes around every op and captures the culprit's
        phase = state.phase()
        snapshot = None
        if self.snapshots and _touches_cuda(args, kwargs):
            with torch._C._DisableTorchDispatch():  # the copies are not the user's ops
                snapshot = self._snapshot(func, name, args, kwargs, phase)
        if not state.light_step:
            return run()
        state.last_op = name
        try:
            result = run()
        except Exception as exc:
            self._raised_light(func, args, kwargs, exc)
            raise
        if snapshot is None:
            specs = tuple(map(spec_tuple, args))
            module = self.where.current_module()
        else:  # the layouts the snapshot read already
            specs = tuple(map(held_spec, snapshot.call.args))
            module = snapshot.module
        state.ops.append((name, module, phase, specs))
        if snapshot is not None and phase == "forward" and self.tag_backward:
            self._tag_later(result, snapshot)
        return result

    def _raised_light(self, func: Any, args: Any, kwargs: dict[str, Any], exc: Exception) -> None:
        """An asserting op raised in a light step: it is the culprit, noted with no public call
        around it (the raise watch adds the one in flight: raise_watch.py)."""
        state = self.state
        name = (self._ops.get(id(func)) or self._learn(func))[0]
        state.last_op = name
        noted = state.culprit
        self._raised(func, name, args, kwargs, exc, None, synchronizing=False)
        if noted is None and state.culprit is not None:
            state.light_culprit = exc

    def _tag_later(self, result: Any, snapshot: Snapshot) -> None:
        """In light steps no module hook tags autograd nodes, and below autograd (the tripwire)
        the output has no node yet: it is tagged when a backward op next asks (_tag_outputs)
        with the snapshot's line, module and call site."""
        if not torch.is_grad_enabled():
            return
        step = self.state.step
        if self._untagged and self._untagged[0][0] != step:
            self._untagged.clear()  # an earlier step's: their backward has run
        tag = (snapshot.source, snapshot.module, snapshot.call_site)
        for tensor in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(tensor, torch.Tensor):
                self._untagged.append((step, weakref.ref(tensor), tag))

    def _tag_outputs(self) -> None:
        """Tag the nodes of the outputs _tag_later kept (they have their nodes by now)."""
        for _, ref, tag in self._untagged:
            tensor = ref()
            grad_fn = None if tensor is None else tensor.grad_fn
            if grad_fn is not None and "reprocut" not in grad_fn.metadata:
                grad_fn.metadata["reprocut"] = tag
        self._untagged.clear()

    def _raised(
        self,
        func: Any,
        name: str,
        args: Any,
        kwargs: dict[str, Any],
        exc: Exception,
        call: dict[str, Any] | None,
        *,
        synchronizing: bool,
    ) -> None:
        """A CUDA error raised here is this op's own only if all earlier work was known complete
        before it ran (a synchronized step); otherwise it merely surfaced here."""
        if self.state.culprit is None and (synchronizing or not is_cuda_error(exc)):
            if call is None:
                call = self._capture(func, name, args, kwargs)
            self._note(func, name, call, synchronized=True)

    def _synchronize_before(self, func: Any, name: str) -> None:
        """A fault already pending here came from outside the dispatcher (a custom kernel)."""
        try:
            torch.cuda.synchronize()
        except Exception:
            self.note_culprit(self.where.culprit_here(synchronized=False))
            raise

    def _capture(self, func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Every small input, as JSON: this op is (or may be) the culprit."""
        names = self._target(func)[1]
        return capture_call(args, kwargs, name, self.store, everything=True, names=names)

    def _target(self, func: Any) -> tuple[str, tuple[str, ...] | None]:
        """The op's callable path and its parameters' names (for the tensor table), cached."""
        found = self._targets.get(id(func))
        if found is None:
            schema = getattr(func, "_schema", None)
            names = None if schema is None else tuple(a.name for a in schema.arguments)
            found = self._targets[id(func)] = (aten_path(func), names, func)
        return found[0], found[1]

    def _snapshot(
        self, func: Any, name: str, args: Any, kwargs: Any, phase: str | None = None
    ) -> Snapshot:
        """Queue host copies of the evidence ahead of the op; build no JSON (see Snapshot)."""
        state, where = self.state, self.where
        state.seq += 1
        if phase is None:
            phase = state.phase()
        target, names = self._target(func)
        call = hold_call(args, kwargs, name, self.store, non_blocking=True, names=names)
        view = where.frames.view(sys._getframe(1))
        backward = phase == "backward"
        if backward and self._untagged:
            self._tag_outputs()
        public_call, public = (None, None) if backward else self.public.context(view)
        tagged = autograd_tag() if backward or not view.user else None
        source = view.source()
        if source is None and tagged is not None:
            source = tagged[0]
        module = where.current_module(view)
        call_site = _tagged_call_site(tagged) if backward else view.call_site()
        snapshot = Snapshot(
            seq=state.seq,
            op=name,
            target=target,
            call=call,
            step=state.step,
            phase=phase,
            module=module,
            source=source,
            public_call=public_call,
            public=public,
            call_site=call_site,
            loop=where.loops.from_view(view.user),
            after_loop=where.loops.training.after_view(view.user),
            test_line=state.test_line(view.user[0][0] if view.user else None),
        )
        state.snapshots.append(snapshot)
        return snapshot

    def _call_site(self) -> SourceLocation | None:
        """The line outside torch that called the API running this op. In backward no such
        frame is on the stack: the forward's, tagged on the autograd node, if any."""
        if self.state.phase() == "backward":
            return _tagged_call_site(autograd_tag())
        return self.where.frames.call_site(sys._getframe(1))

    def _note(self, func: Any, name: str, call: dict[str, Any], *, synchronized: bool) -> None:
        state, where = self.state, self.where
        if self._untagged:
            self._tag_outputs()
        try:
            public_call, public = self.public.context()
        except Exception:  # after a sticky CUDA error nothing more can be copied
            public_call, public = (
                (state.public_stack[0][1] if state.public_stack else None),
                None,
            )
        tagged = autograd_tag()
        phase = state.phase()
        forward_source = tagged[0] if tagged else None
        module = where.current_module()
        if module is None and tagged is not None:
            module = tagged[1]
        source = where.frames.here()
        if phase == "backward" and forward_source is not None:
            source = source or forward_source
        self.note_culprit(
            Culprit(
                op=name,
                target=self._target(func)[0],
                call=call,
                step=state.step,
                phase=phase,
                module=module,
                source=source,
                forward_source=forward_source,
                public_call=public_call,
                public=None if public is None else public.to_json(),
                synchronized=synchronized,
                call_site=self._call_site(),
                loop=where.loops.read(sys._getframe(1)),
                after_loop=where.loops.training.after_frame(sys._getframe(1)),
                test_line=state.test_line(sys._getframe(1)),
            )
        )


def _tagged_call_site(tagged: tuple[Any, ...] | None) -> SourceLocation | None:
    """The forward call site an autograd node was tagged with (older tags have none)."""
    return tagged[2] if tagged is not None and len(tagged) > 2 else None


def _touches_cuda(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return not on_cpu(args, kwargs)
