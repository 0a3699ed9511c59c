"""Inside the user's process, in the step a non-finite flag flipped: check every op's outputs.

The dispatch mode hands each op of the localized step here. After the op runs, its floating
outputs are checked for NaN and inf (a host sync per op: this step only). The first op whose
outputs hold one while every floating input and float scalar argument was finite made it
(`born`); its inputs are captured as they were before it ran (written arguments of in-place ops
are cloned first). A NaN made from inputs holding only inf (`from-inf`: softmax over a row of
-inf) and a value already in an input when the step began (`entered`: data, a buffer) are kept
as fallbacks. Ops that read a tainted storage and hand the value on form the chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from reprocut.model.nonfinite import BORN, ENTERED, FROM_INF
from reprocut.record.inside.capture import (
    MAX_CAPTURED_ELEMENTS,
    HeldCall,
    HeldList,
    HeldTensor,
    TensorStore,
)
from reprocut.record.inside.capture import _scalar_json as scalar_json
from reprocut.record.inside.nonfinite import unrecorded
from reprocut.record.inside.state import RunState
from reprocut.record.inside.where import Where, autograd_tag

CHAIN_LENGTH = 6
MAX_CLONED_ELEMENTS = 1 << 26  # in-place ops writing more than this are not copied first
# outputs that are uninitialized memory or not values: never an origin
UNCHECKED = frozenset(
    {
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::empty_permuted",
        "aten::resize_",
        "aten::set_",
        "aten::_local_scalar_dense",
        "aten::detach",
    }
)


def value_kind(value: Any) -> str | None:
    """ "nan" if a floating tensor (or float) in `value` holds NaN, else "inf" if one holds inf."""
    found = None
    for item in _leaves(value):
        if isinstance(item, torch.Tensor):
            if not item.is_floating_point() or not item.numel():
                continue
            with unrecorded():
                if bool(item.isfinite().all()):
                    continue
                if bool(item.isnan().any()):
                    return "nan"
        elif isinstance(item, float):
            if math.isfinite(item):
                continue
            if math.isnan(item):
                return "nan"
        else:
            continue
        found = "inf"
    return found


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    try:
        return (str(tensor.device), tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None


class DispatchMode(Protocol):
    """What the checks use of the dispatch mode that hands them its ops (ops.OpRecorder)."""

    def record_op(self, name: str, args: tuple[Any, ...], phase: str | None = None) -> None: ...

    def _target(self, func: Any) -> tuple[str, tuple[str, ...] | None]: ...

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
    ) -> None: ...


@dataclass
class Candidate:
    """One possible origin, with the chain of ops that read what it made."""

    how: str
    record: dict[str, Any]
    chain: list[dict[str, Any]] = field(default_factory=list)
    tainted: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)  # kept alive

    def taint(self, value: Any) -> None:
        for item in _leaves(value):
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                key = _storage_key(item)
                if key is not None:
                    self.tainted[key] = item

    def reads(self, values: list[Any]) -> bool:
        return any(
            isinstance(item, torch.Tensor) and _storage_key(item) in self.tainted for item in values
        )


class OpWatch:
    """Finite checks around every op of the localized step; the result goes to outcome.json."""

    def __init__(self, state: RunState, where: Where, store: TensorStore) -> None:
        self.state = state
        self.where = where
        self.store = store
        self.candidates: dict[str, Candidate] = {}
        self.checked = 0
        self._written: dict[int, tuple[tuple[int, ...], Any]] = {}  # by id(op)

    @property
    def done(self) -> bool:
        born = self.candidates.get(BORN)
        return born is not None and len(born.chain) >= CHAIN_LENGTH

    def dispatch(
        self,
        mode: DispatchMode,
        func: Any,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run one op of the localized step, checking what it made."""
        if self.done or name in UNCHECKED:
            return self._run(mode, func, name, args, kwargs)
        before = self._before(func, args) if BORN not in self.candidates else {}
        returned = result = self._run(mode, func, name, args, kwargs)
        self.checked += 1
        if result is None:  # in-place ops that return nothing (_foreach_add_): what they wrote
            positions = self._written.get(id(func), ((),))[0]
            result = [args[i] for i in positions if i < len(args)]
        out_kind = value_kind(result)
        flat_in = [*_leaves(list(args)), *_leaves(kwargs)]
        for candidate in self.candidates.values():
            if len(candidate.chain) < CHAIN_LENGTH and candidate.reads(flat_in) and out_kind:
                candidate.chain.append(self._where(name, out_kind))
                candidate.taint(result)
        if out_kind is None or BORN in self.candidates:
            return returned
        inputs = tuple(before.get(i, arg) for i, arg in enumerate(args))
        in_kind = value_kind([list(inputs), kwargs])
        if in_kind is None:
            self._add(BORN, mode, func, name, inputs, kwargs, out_kind, result)
        elif any(c.reads(flat_in) for c in self.candidates.values()):
            return returned  # carried on from a candidate: a link, not an origin
        elif out_kind == "nan" and in_kind == "inf" and FROM_INF not in self.candidates:
            self._add(FROM_INF, mode, func, name, inputs, kwargs, out_kind, result)
        elif ENTERED not in self.candidates:
            self._add(ENTERED, mode, func, name, inputs, kwargs, out_kind, result)
            self.candidates[ENTERED].record["entered_as"] = self._entered_as(func, inputs, kwargs)
        return returned

    def _run(
        self,
        mode: DispatchMode,
        func: Any,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            mode._raised(func, name, args, kwargs, exc, None, synchronizing=False)
            raise
        mode.record_op(name, args)
        return result

    def _before(self, func: Any, args: tuple[Any, ...]) -> dict[int, Any]:
        """Copies of the arguments an in-place op writes, as they were before it ran."""
        written = self._written.get(id(func))
        if written is None:
            schema = getattr(func, "_schema", None)
            positions = tuple(
                i
                for i, a in enumerate(schema.arguments if schema is not None else ())
                if a.alias_info is not None and a.alias_info.is_write
            )
            written = self._written[id(func)] = (positions, func)
        copies: dict[int, Any] = {}
        for i in written[0]:
            if i < len(args):
                copies[i] = _copy(args[i])
        return copies

    def _where(self, name: str, kind: str) -> dict[str, Any]:
        state, where = self.state, self.where
        tagged = autograd_tag()
        phase = state.phase()
        source = where.frames.here()
        module = where.current_module()
        if tagged is not None:  # a backward op: the forward line that built its node
            source = tagged[0] if phase == "backward" and tagged[0] else source or tagged[0]
            module = module or tagged[1]
        node = torch._C._current_autograd_node()
        return {
            "op": name,
            "kind": kind,
            "step": state.step,
            "phase": phase,
            "module": module,
            "source": None if source is None else source.to_json(),
            "autograd_node": None if node is None else node.name(),
        }

    def _add(
        self,
        how: str,
        mode: DispatchMode,
        func: Any,
        name: str,
        inputs: tuple[Any, ...],
        kwargs: dict[str, Any],
        kind: str,
        result: Any,
    ) -> None:
        store = self.store
        target, names = mode._target(func)
        record = {"how": how, **self._where(name, kind), "target": target}
        record["call"] = _hold_call(inputs, kwargs, store, names).to_json()
        if how == BORN:  # the case to shrink: also the public call the user made, if any
            public_stack = self.state.public_stack
            public = public_stack[0] if public_stack else None
            in_place = bool(self._written.get(id(func), ((),))[0])
            if public is not None and not in_place and record["phase"] != "backward":
                record["public_call"] = public[1]
                record["public"] = _hold_call(public[2], public[3], store, None).to_json()
        candidate = Candidate(how, record)
        candidate.taint(result)
        self.candidates[how] = candidate

    def _entered_as(self, func: Any, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The input that already held the value: a parameter or buffer by name, else its
        argument name, or a float scalar."""
        schema = getattr(func, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        for position, value in [*enumerate(inputs), *kwargs.items()]:
            if value_kind(value) is None:
                continue
            if isinstance(value, torch.Tensor):
                owner = self._owner(value)
                if owner:
                    return owner
            label = (
                names[position] if isinstance(position, int) and position < len(names) else position
            )
            return f"{label} (a float scalar)" if isinstance(value, float) else str(label)
        return ""

    def _owner(self, tensor: torch.Tensor) -> str | None:
        key = _storage_key(tensor)
        for module, path in list(self.where.module_names.names.items()):
            for kind in ("_parameters", "_buffers"):
                for name, owned in getattr(module, kind, {}).items():
                    if owned is not None and _storage_key(owned) == key:
                        return f"{path}.{name}"
        return None

    def to_json(self) -> dict[str, Any]:
        found = {}
        for how, candidate in self.candidates.items():
            found[how] = {**candidate.record, "chain": candidate.chain}
        return {"checked_ops": self.checked, "candidates": found}


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() > MAX_CLONED_ELEMENTS:
            return value
        with unrecorded():
            return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    return value


def _hold_call(
    args: tuple[Any, ...], kwargs: dict[str, Any], store: TensorStore, names: Any
) -> HeldCall:
    """A call with every tensor's values copied (up to MAX_CAPTURED_ELEMENTS): for an origin,
    floats are the evidence, whatever their size."""
    return HeldCall(
        tuple(_hold(a, store) for a in args),
        tuple((k, _hold(v, store)) for k, v in kwargs.items()),
        None if names is None else tuple(names),
    )


def _hold(value: Any, store: TensorStore) -> Any:
    if isinstance(value, torch.Tensor):
        key = None
        if value.layout == torch.strided and value.numel() <= MAX_CAPTURED_ELEMENTS:
            with unrecorded():
                key = store.add(value)
        return HeldTensor.from_tensor(value, key)
    if isinstance(value, (list, tuple)):
        return HeldList(tuple(_hold(v, store) for v in value))
    return scalar_json(value)
