"""Inside the user's process, with `--nan`: did this step make a NaN or inf? One read per step.

Checking every op's output costs a host sync per op. Instead, what a step hands on (the losses
given to backward, the gradients and parameters once the optimizer's step is done, the outputs
of top-level modules until a loss goes to backward) is reduced on the device by
`_foreach_norm(ord=inf)` (no overflow, and NaN propagates). A training step makes one check, at
its end: small losses, gradients and parameters together, one launch per dtype, in one
`unrecorded` block with the stacking of the norms and their copy to the host. On the CPU they
are read there; on CUDA they go to a reused pinned buffer behind a reused event (host_ring.py)
and are read once the event reports completion, so no step waits for the GPU. Everything else
(isfinite, which check flipped) happens on the host: on a launch-bound loop each launch and
each Python call counts.
The first step whose norms are not all finite is what the localizer reruns op by op
(finite_watch.py). A run that goes on after it is stopped GRACE_STEPS later with NonfiniteStop:
a NaN loss does not end a training script by itself.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from operator import is_
from typing import Any

import torch

from reprocut.record.inside.host_ring import EventPool, PinnedBuffers

GRACE_STEPS = 5  # steps a run may go on after its first non-finite step, to see where it ends
MAX_NORMS_PER_STEP = 4096
# A loss this small waits for the step's next check (the gradients'): one launch for both. It is
# not changed in between (backward only reads it); a larger one (activations given to backward
# with their gradients) is reduced at once rather than kept alive.
DEFERRED_LOSS_ELEMENTS = 1 << 16
MAX_DEFERRED = 64
_INF = float("inf")
_STRIDED = torch.strided
_Key = tuple[torch.dtype, int]  # a dtype and a device index (get_device: -1 for the CPU)
# a CUDA copy of a step's norms: (device index, its event, the pinned buffer it fills)
_Copy = tuple[int, Any, torch.Tensor]
# a step's norms on their way to the host: (step, host tensors, CUDA copies, what each is for)
_Queued = tuple[int, list[torch.Tensor], list[_Copy], list[str]]


class NonfiniteStop(BaseException):
    """Raised by reprocut at a step boundary to end a run whose non-finite origin is known.

    A BaseException, so the user's `except Exception` does not swallow it."""


class unrecorded:  # lower case: used like a function, `with unrecorded():`
    """Work that is reprocut's own: no mode sees it and autograd does not record it.

    A class, not a generator context manager: it runs several times per step on the hot path,
    where contextlib's machinery and `torch.no_grad()` cost more than the work inside."""

    __slots__ = ("_dispatch", "_function", "_grad")

    def __enter__(self) -> None:
        self._dispatch = torch._C._DisableTorchDispatch()
        self._function = torch._C.DisableTorchFunction()
        self._dispatch.__enter__()
        self._function.__enter__()
        self._grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        torch._C._set_grad_enabled(self._grad)
        self._function.__exit__(None, None, None)
        self._dispatch.__exit__(None, None, None)


def floating_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The floating-point tensors in a module's output (a tensor, a sequence, a dict)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.layout == torch.strided and value.numel():
            yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from floating_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from floating_tensors(item)


def watch_backward(flags: StepFlags) -> Callable[..., Any]:
    """Let `flags` see every loss handed to backward; returns the original to put back."""
    original = torch.autograd.backward

    def watched_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        flags.watch_loss(tensors)
        return original(tensors, *args, **kwargs)

    torch.autograd.backward = watched_backward
    return original


def step_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The max-abs norm of each tensor, in order, as 0-dim tensors on its device: one launch
    per device and dtype, no host sync. A norm is finite exactly when its tensor is."""
    with unrecorded():
        return _norms(tensors)[0]


def _norms(tensors: list[torch.Tensor], key: _Key | None = None) -> tuple[list[torch.Tensor], bool]:
    """step_norms inside an `unrecorded` block, and whether the norms are all on one device.
    `key` is the one dtype and device all the tensors are known to share; else one device and
    dtype, the usual case, is found with two cheap getters per tensor (`get_device` is an int;
    `.device` builds an object)."""
    if key is None:
        key = _uniform_key(tensors)
    if key is not None:
        return list(torch._foreach_norm(tensors, _INF)), True
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault((tensor.device, tensor.dtype), []).append(i)
    norms: list[Any] = [None] * len(tensors)
    for positions in groups.values():
        group = [tensors[i] for i in positions]
        for i, norm in zip(positions, torch._foreach_norm(group, _INF), strict=True):
            norms[i] = norm
    return norms, len({device for device, _ in groups}) == 1


def _uniform_key(tensors: list[torch.Tensor]) -> _Key | None:
    """The (dtype, device index) every tensor has, or None."""
    first = tensors[0]
    dtype, index = first.dtype, first.get_device()
    if all(t.dtype is dtype and t.get_device() == index for t in tensors):
        return dtype, index
    return None


class StepFlags:
    """The per-step non-finite checks of one run, and the first step that failed one."""

    def __init__(self, *, stop_after: int | None = GRACE_STEPS) -> None:
        self.stop_after = stop_after  # steps after the first flagged one; None: never stop
        self.first_step: int | None = None
        self.checked_through = -1  # the last step whose norms have been read
        self.stopped_at: int | None = None
        self._norms: list[torch.Tensor] = []  # the current step's, 0-dim, on their devices
        self._what: list[str] = []  # which check each norm is for ("gradients", ...)
        self._pending: list[_Queued] = []
        self.what: str | None = None  # which check flipped first
        self.losses_seen = False  # a loss went to backward: outputs need no check of their own
        self._deferred: list[torch.Tensor] = []  # losses reduced with the next check
        # reduced at the step's end: (what, tensors, the dtype and device they share)
        self._at_end: list[tuple[str, list[torch.Tensor], _Key | None]] = []
        self._optimizer: Any = None  # entered, not yet left (it may raise)
        # the optimizer's tensors as last seen, its dense floating ones, their shared key
        self._params: tuple[list[Any], list[torch.Tensor], _Key | None] | None = None
        self._buffers = PinnedBuffers()
        self._events = EventPool()

    # --- what the recorder hands over ---------------------------------------------------------

    def watch(self, what: str, tensors: Iterable[torch.Tensor]) -> None:
        """Reduce `tensors` now (with the losses waiting, which came first)."""
        checked = [t for t in tensors if t.is_floating_point() and t.numel()]
        if self._deferred:  # the losses first: they came first
            losses, self._deferred = self._deferred, []
            norms = step_norms([*losses, *checked])
            self._norms.extend(norms)
            self._what.extend(["loss"] * len(losses) + [what] * len(checked))
        elif checked:
            self._norms.extend(step_norms(checked))
            self._what.extend([what] * len(checked))
        if len(self._norms) > MAX_NORMS_PER_STEP:  # a loop with no step boundary: fold them
            self._fold()

    def _fold(self) -> None:
        """One 0-dim float per device, NaN where some norm was not finite."""
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for norm in self._norms:
            by_device.setdefault(norm.device, []).append(norm)
        with unrecorded():
            folded = [
                torch.where(torch.stack(norms).isfinite().all(), 0.0, float("nan"))
                for norms in by_device.values()
            ]
        self._norms = folded
        self._what = [" or ".join(dict.fromkeys(self._what))] * len(folded)

    def watch_loss(self, tensors: Any) -> None:
        self.losses_seen = True
        losses = list(floating_tensors(tensors))
        if all(t.numel() <= DEFERRED_LOSS_ELEMENTS for t in losses):
            self._deferred.extend(losses)
            if len(self._deferred) < MAX_DEFERRED:
                return
            losses = []
        self.watch("loss", losses)

    def enter_optimizer(self, optimizer: Any) -> None:
        """The optimizer's step began: nothing is reduced yet (see watch_optimizer), but if it
        raises, `flush` still checks its gradients and parameters."""
        self._optimizer = optimizer

    def watch_optimizer(self, optimizer: Any) -> None:
        """The optimizer's step is done: its gradients and parameters are reduced at the step's
        end, with the losses waiting, in one launch per dtype: the step's only check.

        Checking the gradients here rather than before the step loses nothing: the optimizer
        reads them and does not change them, a non-finite one would have made its parameter
        non-finite by now anyway, and the norms are per tensor, so `flagged_by` still names
        the gradients when they held the first non-finite value. An optimizer that made a
        parameter non-finite from finite gradients is named as `parameters`."""
        self._optimizer = None
        params, key = self._parameters(optimizer)
        # a dense gradient has its parameter's dtype and device (torch checks): the same key
        grads = [g for p in params if (g := p.grad) is not None and g.layout is _STRIDED]
        if grads:
            self._at_end.append(("gradients", grads, key))
        if params:
            self._at_end.append(("parameters", params, key))

    def _parameters(self, optimizer: Any) -> tuple[list[torch.Tensor], _Key | None]:
        """The optimizer's dense floating parameters and the dtype and device they share (if
        they do): worked out again only when its groups no longer hold the very same tensors
        (`add_param_group`, a parameter swapped for a resized one)."""
        held = [p for group in optimizer.param_groups for p in group["params"]]
        cached = self._params
        if cached is not None and len(cached[0]) == len(held) and all(map(is_, held, cached[0])):
            return cached[1], cached[2]
        params = [p for p in held if p.layout is _STRIDED and p.is_floating_point() and p.numel()]
        key = _uniform_key(params) if params else None
        self._params = (held, params, key)
        return params, key

    def watch_output(self, output: Any) -> None:
        """Top-level modules' outputs: an evaluation loop's only check. Once losses go to
        backward, a non-finite output shows in the loss or the gradients of the same step, and
        on a launch-bound loop the launch saved is worth it."""
        if not self.losses_seen:
            self.watch("model outputs", floating_tensors(output))

    # --- step boundaries ----------------------------------------------------------------------

    def end_step(self, step: int) -> None:
        """Reduce the step's flags to one, start reading it, and read the finished ones; past
        the grace steps after the first flagged step, stop the run."""
        self._queue(step)
        self._read(block=False)
        if (
            self.stop_after is not None
            and self.first_step is not None
            and step >= self.first_step + self.stop_after
        ):
            self.stopped_at = step
            raise NonfiniteStop(f"stopped {self.stop_after} steps after step {self.first_step}")

    def end_localized_step(self, step: int, first: int | None, last: int | None) -> None:
        """A rerun localizing steps first..last: stop once they are done, or as soon as a
        step before them flipped (the localizer reruns that one instead)."""
        self.stop_after = None
        self.end_step(step)
        if self.first_step is not None and self.first_step < (first or 0):
            raise NonfiniteStop(f"step {self.first_step} flipped before the localized step")
        if last is not None and step >= last:
            self.flush(step)
            raise NonfiniteStop("the localized step is done")

    def flush(self, in_flight_step: int) -> None:
        """Read every flag still pending, the step in flight's too (the run is over, maybe
        inside an optimizer that raised); after a sticky CUDA error they stay unread."""
        with contextlib.suppress(Exception):
            if self._optimizer is not None:
                self.watch_optimizer(self._optimizer)
            self._queue(in_flight_step)
            self._read(block=True)

    def _queue(self, step: int) -> None:
        """Reduce what waited for the step's end (losses, the optimizer's tensors) and copy all
        the step's norms to the host: stacked per device, on CUDA into a pinned buffer behind
        an event. One `unrecorded` block for all of it."""
        losses = self._deferred
        tensors, what = list(losses), ["loss"] * len(losses)
        key = self._at_end[0][2] if self._at_end else None
        for name, group, group_key in self._at_end:
            tensors += group
            what += [name] * len(group)
            if group_key != key:
                key = None
        if key is not None and not all((t.dtype, t.get_device()) == key for t in losses):
            key = None
        self._deferred, self._at_end = [], []
        if not tensors and not self._norms:
            return
        with unrecorded():
            norms, one_device = _norms(tensors, key) if tensors else ([], True)
            if self._norms:  # checked earlier in the step (outputs, a large loss)
                norms, what = self._norms + norms, self._what + what
                index = norms[0].get_device()
                one_device = all(norm.get_device() == index for norm in norms)
            if one_device:
                queued = self._copy(torch.stack(norms), norms[0].device, what)
            else:
                queued = self._copy_by_device(norms, what)
        self._pending.append((step, *queued))
        self._norms, self._what = [], []

    def _copy(
        self, stacked: torch.Tensor, device: torch.device, what: list[str]
    ) -> tuple[list[torch.Tensor], list[_Copy], list[str]]:
        """Start copying one device's stacked norms to the host: (host tensors, the CUDA
        copies' events, what each value is for)."""
        if device.type == "cpu":
            return [stacked], [], what
        if device.type != "cuda":
            return [stacked.to("cpu", non_blocking=True)], [], what
        host = self._buffers.take(stacked.dtype, stacked.shape)
        host.copy_(stacked, non_blocking=True)  # behind the step's kernels
        event = self._events.take(device.index)
        event.record(torch.cuda.current_stream(device))
        return [host], [(device.index, event, host)], what

    def _copy_by_device(
        self, norms: list[torch.Tensor], what: list[str]
    ) -> tuple[list[torch.Tensor], list[_Copy], list[str]]:
        by_device: dict[torch.device, list[int]] = {}
        for i, norm in enumerate(norms):
            by_device.setdefault(norm.device, []).append(i)
        parts, events, order = [], [], []
        for device, positions in by_device.items():
            stacked = torch.stack([norms[i] for i in positions])
            host, device_events, _ = self._copy(stacked, device, what)
            parts += host
            events += device_events
            order += [what[i] for i in positions]
        return parts, events, order

    def _read(self, *, block: bool) -> None:
        while self._pending:
            step, host, events, what = self._pending[0]
            if events:
                if not block and not all(event.query() for _, event, _ in events):
                    return
                for _, event, _ in events:
                    event.synchronize()
            self._pending.pop(0)
            values = host[0].tolist() if len(host) == 1 else [v for h in host for v in h.tolist()]
            for device, event, buffer in events:  # read: to be used again
                self._events.give_back(device, event)
                self._buffers.give_back(buffer)
            self.checked_through = max(self.checked_through, step)
            if self.first_step is None and not math.isfinite(sum(values)):
                bad = [i for i, value in enumerate(values) if not math.isfinite(value)]
                if bad:  # else a sum of large finite values overflowed
                    self.first_step = step
                    self.what = what[bad[0]]

    def to_json(self) -> dict[str, Any]:
        return {
            "first_step": self.first_step,
            "flagged_by": self.what,
            "checked_through": self.checked_through,
            "stopped_at": self.stopped_at,
        }
