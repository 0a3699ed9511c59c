"""Inside the user's process, at each aten op: record its specs, snapshot or capture its inputs.

The Recorder (recorder.py) turns this dispatch mode on for the steps that record every op, and
hands `on_asserting_call` to the tripwire, which sees the asserting ops of every step. What an op
leaves goes to the Recorder: its specs to the step's trace, Snapshots, and at most one Culprit.

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
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reprocut.model.case import SourceLocation
from reprocut.model.publicapi import aten_name, aten_path
from reprocut.model.signature import is_cuda_failure
from reprocut.record.inside.capture import (
    ASSERTING_OPS,
    HeldList,
    HeldTensor,
    capture_call,
    hold_call,
)
from reprocut.record.inside.records import Culprit, Snapshot

if TYPE_CHECKING:
    from reprocut.record.inside.recorder import Recorder


class OpRecorder(TorchDispatchMode):
    """Aten ops: record specs; snapshot or synchronize where the mode asks for it."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
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
        recorder = self.recorder
        entry = self._ops.get(id(func))
        if entry is None:
            entry = self._learn(func)
        name = entry[0]
        recorder.last_op = name
        if recorder.localizing or entry[1]:
            return self._dispatch_watched(func, name, args, kwargs or {})
        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:
            self._raised(func, name, args, kwargs or {}, exc, None, synchronizing=False)
            raise
        state = recorder.state
        stack = state.module_stack
        recorder.ops.append(
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
        recorder = self.recorder
        watched = recorder.config.snapshots and recorder.tripwire is None and name in ASSERTING_OPS
        entry = self._ops[id(func)] = (name, watched, func)
        return entry

    def _dispatch_watched(self, func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> Any:
        """An op that may need its inputs copied first: snapshots, or a localized step."""
        recorder = self.recorder
        if recorder.localizing and recorder.op_watch is not None:  # --nan: finite checks
            return recorder.op_watch.dispatch(self, func, name, args, kwargs)
        call = None
        synchronizing = recorder.localizing and torch.cuda.is_initialized()
        if synchronizing:
            # every op, CUDA arguments or not: a host-to-device copy also raises pending faults
            self._synchronize_before(func, name)
            recorder.public_context()  # copy the public call's inputs before any fault
            call = self._capture(func, name, args, kwargs)
        elif recorder.config.snapshots and name in ASSERTING_OPS and _touches_cuda(args, kwargs):
            self._snapshot(func, name, args, kwargs)
        try:
            result = func(*args, **kwargs)
            if synchronizing:
                torch.cuda.synchronize()
        except Exception as exc:
            self._raised(func, name, args, kwargs, exc, call, synchronizing=synchronizing)
            raise
        recorder.record_op(name, args)
        return result

    def on_asserting_call(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Any
    ) -> Any:
        """The tripwire's handler: snapshot the evidence; in light steps also record the op and
        own its synchronous error (under the dispatch mode, the mode does both)."""
        recorder = self.recorder
        entry = self._ops.get(id(func)) or self._learn(func)
        name = entry[0]
        if recorder.localizing:
            return run()  # the mode synchronizes around every op and captures the culprit's
        phase = recorder.state.phase()
        snapshot = None
        if recorder.config.snapshots and _touches_cuda(args, kwargs):
            with torch._C._DisableTorchDispatch():  # the copies are not the user's ops
                snapshot = self._snapshot(func, name, args, kwargs, phase)
        if not recorder.light_step:
            return run()
        recorder.last_op = name
        try:
            result = run()
        except Exception as exc:
            self._raised(func, name, args, kwargs, exc, None, synchronizing=False)
            raise
        if snapshot is None:
            specs = tuple(map(spec_tuple, args))
            module = recorder.current_module()
        else:  # the layouts the snapshot read already
            specs = tuple(map(held_spec, snapshot.call.args))
            module = snapshot.module
        recorder.ops.append((name, module, phase, specs))
        if snapshot is not None and phase == "forward" and recorder.config.tag_backward:
            self._tag_later(result, snapshot)
        return result

    def _tag_later(self, result: Any, snapshot: Snapshot) -> None:
        """In light steps no module hook tags autograd nodes, and below autograd (the tripwire)
        the output has no node yet: it is tagged when a backward op next asks (_tag_outputs)
        with the snapshot's line, module and call site."""
        if not torch.is_grad_enabled():
            return
        step = self.recorder.state.step
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
        recorder = self.recorder
        if recorder.culprit is None and (synchronizing or not is_cuda_error(exc)):
            if call is None:
                call = self._capture(func, name, args, kwargs)
            self._note(func, name, call, synchronized=True)

    def _synchronize_before(self, func: Any, name: str) -> None:
        """A fault already pending here came from outside the dispatcher (a custom kernel)."""
        try:
            torch.cuda.synchronize()
        except Exception:
            self.recorder.note_culprit_here(synchronized=False)
            raise

    def _capture(self, func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Every small input, as JSON: this op is (or may be) the culprit."""
        names = self._target(func)[1]
        store = self.recorder.store
        return capture_call(args, kwargs, name, store, everything=True, names=names)

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
        recorder = self.recorder
        recorder.seq += 1
        if phase is None:
            phase = recorder.state.phase()
        target, names = self._target(func)
        call = hold_call(args, kwargs, name, recorder.store, non_blocking=True, names=names)
        view = recorder.frames.view(sys._getframe(1))
        backward = phase == "backward"
        if backward and self._untagged:
            self._tag_outputs()
        public_call, public = (None, None) if backward else recorder.public_context(view)
        tagged = _autograd_tag() if backward or not view.user else None
        source = view.source()
        if source is None and tagged is not None:
            source = tagged[0]
        module = recorder.current_module(view)
        call_site = _tagged_call_site(tagged) if backward else view.call_site()
        snapshot = Snapshot(
            seq=recorder.seq,
            op=name,
            target=target,
            call=call,
            step=recorder.state.step,
            phase=phase,
            module=module,
            source=source,
            public_call=public_call,
            public=public,
            call_site=call_site,
            loop=recorder.loops.from_view(view.user),
        )
        recorder.snapshots.append(snapshot)
        return snapshot

    def _call_site(self) -> SourceLocation | None:
        """The line outside torch that called the API running this op. In backward no such
        frame is on the stack: the forward's, tagged on the autograd node, if any."""
        if self.recorder.state.phase() == "backward":
            return _tagged_call_site(_autograd_tag())
        return self.recorder.frames.call_site(sys._getframe(1))

    def _note(self, func: Any, name: str, call: dict[str, Any], *, synchronized: bool) -> None:
        recorder = self.recorder
        if self._untagged:
            self._tag_outputs()
        try:
            public_call, public = recorder.public_context()
        except Exception:  # after a sticky CUDA error nothing more can be copied
            public_call, public = (
                (recorder.public_stack[0][1] if recorder.public_stack else None),
                None,
            )
        tagged = _autograd_tag()
        phase = recorder.state.phase()
        forward_source = tagged[0] if tagged else None
        module = recorder.current_module()
        if module is None and tagged is not None:
            module = tagged[1]
        source = recorder.frames.here()
        if phase == "backward" and forward_source is not None:
            source = source or forward_source
        recorder.note_culprit(
            Culprit(
                op=name,
                target=self._target(func)[0],
                call=call,
                step=recorder.state.step,
                phase=phase,
                module=module,
                source=source,
                forward_source=forward_source,
                public_call=public_call,
                public=None if public is None else public.to_json(),
                synchronized=synchronized,
                call_site=self._call_site(),
                loop=recorder.loops.read(sys._getframe(1)),
            )
        )


def _autograd_tag() -> tuple[SourceLocation | None, str | None] | None:
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    return node.metadata.get("reprocut")


def _tagged_call_site(tagged: tuple[Any, ...] | None) -> SourceLocation | None:
    """The forward call site an autograd node was tagged with (older tags have none)."""
    return tagged[2] if tagged is not None and len(tagged) > 2 else None


def is_cuda_error(exc: BaseException) -> bool:
    return is_cuda_failure(type(exc).__name__, str(exc), getattr(exc, "error_code", None))


def on_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """No tensor argument (or tensor in a list argument) is on another device than the CPU
    (`is_cpu`: a getter; `.device.type` builds a device object)."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            if not value.is_cpu:
                return False
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor) and not item.is_cpu:
                    return False
    return True


def _touches_cuda(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return not on_cpu(args, kwargs)


_Tensor = torch.Tensor
_STRIDED = torch.strided


def spec_tuple(value: Any) -> Any:
    """A tensor's layout as cheap, hashable objects; made JSON-ready only when written.

    Runs for every argument of every op: a few C getters, and the device object as it is
    (`.device.type` alone costs more than the other getters together)."""
    if isinstance(value, _Tensor):
        if value.layout is not _STRIDED:
            return (value.shape, value.dtype, None, 0, value.device)
        return (value.shape, value.dtype, value.stride(), value.storage_offset(), value.device)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], _Tensor):
        return tuple(map(spec_tuple, value))
    return None


def held_spec(value: Any) -> Any:
    """spec_tuple of an argument as `hold_arg` held it: the same tuple, from the layout read
    then (a snapshot's tensors have been read once; their getters are not asked again)."""
    kind = type(value)
    if kind is HeldTensor:
        return (value.shape, value.dtype, value.stride, value.storage_offset, value.device)
    if kind is HeldList and value.items and type(value.items[0]) is HeldTensor:
        return tuple(map(held_spec, value.items))
    return None
