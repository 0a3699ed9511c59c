"""What the launch probe read at the failing call, as values.

The probe's child (or the blocking rerun, reprocut.record.inside.launch_read) writes JSON; this
is what it means: the tensors' specs by argument and by parameter, the range of integer tensors'
values, the plain values of the launch itself, the addresses of the tensors the frame held.
Readers (`reprocut.localize.kernel_facts`, the source reducer's specs) need these values and
not how they were read, so they live apart from the probing. `with_value_ranges` turns the
integer ranges into generated values the reducer can hand the kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from reprocut.model.case import Generated, TensorSpec, spec_from_json
from reprocut.source.focus import call_argument_sources


@dataclass(frozen=True, slots=True)
class IntegerRange:
    """The smallest and largest value of an integer tensor reaching the call, and where."""

    low: int
    high: int
    low_at: tuple[int, ...]
    high_at: tuple[int, ...]
    numel: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IntegerRange:
        shape = tuple(data["shape"])
        return cls(data["low"], data["high"], _unravel(data["low_at"], shape),
                   _unravel(data["high_at"], shape), math.prod(shape))  # fmt: skip


@dataclass(frozen=True, slots=True)
class LaunchValues:
    """The plain values of the call itself: each positional argument's (None: not a number or
    a tuple of numbers), the keywords', the grid of a `kernel[grid](...)` launch, and the
    library whose object was called ("triton", "cupy", ...)."""

    args: tuple[Any, ...] = ()
    keywords: tuple[tuple[str, Any], ...] = ()
    grid: Any = None
    library: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchValues:
        return cls(
            args=tuple(_tuples(v) for v in data.get("args", ())),
            keywords=tuple((name, _tuples(v)) for name, v in data.get("keywords", ())),
            grid=_tuples(data.get("grid")),
            library=data.get("library"),
        )


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for size in reversed(shape):
        coords.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(coords))


@dataclass(frozen=True, slots=True)
class TensorPointer:
    """A tensor the launching frame held, by address: where its data starts and its storage's
    bytes (an integer argument that falls there is a pointer into it, not a number)."""

    name: str
    address: int
    storage_start: int
    storage_bytes: int
    spec: TensorSpec

    def holds(self, value: int) -> bool:
        return self.storage_start <= value < self.storage_start + max(self.storage_bytes, 1)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorPointer:
        return cls(data["name"], data["address"], data["storage"], data["bytes"],
                   spec_from_json(data["spec"]))  # fmt: skip


@dataclass(frozen=True, slots=True)
class LaunchSpecs:
    """The tensors at the failing call, seen just before it ran: its arguments by position
    (None: not a tensor), the tensor parameters of the function making it, and that function's
    plain parameters (numbers, strings, tuples of them) with their values."""

    args: tuple[TensorSpec | None, ...] = ()
    params: tuple[tuple[str, TensorSpec], ...] = ()
    values: tuple[tuple[str, Any], ...] = ()
    kernel: str | None = None  # the launched kernel's own name (`cmvn_vec4`, not `_KERNEL`)
    integers: tuple[tuple[str, IntegerRange], ...] = ()  # integer tensors' values, by name
    launch: LaunchValues = field(default_factory=LaunchValues)
    pointers: tuple[TensorPointer, ...] = ()  # the tensors the launching frame held


INT64_MAX = 2**63 - 1


def with_value_ranges(launch: LaunchSpecs, focus: str) -> LaunchSpecs:
    """Integer tensors at the launch generated across the range they had (ids, offsets), not
    as zeros: a spec alone would hand the kernel row 0 everywhere, and the out-of-range id that
    faulted would be gone. Other specs as they are. `focus`: the call's text (arguments are
    named by their source there)."""
    ranges = dict(launch.integers)
    sources = call_argument_sources(focus)

    def ranged(name: str | None, spec: TensorSpec | None) -> TensorSpec | None:
        found = ranges.get(name) if name is not None else None
        if spec is None or found is None or not isinstance(spec.values, (Generated, type(None))):
            return spec  # values recorded as they were: keep them
        if spec.dtype.startswith(("float", "bfloat", "complex", "bool")):
            return spec
        if found.low < found.high < INT64_MAX:
            return replace(spec, values=Generated("randint", found.low, found.high + 1))
        return replace(spec, values=Generated("full", found.low))

    return replace(
        launch,
        args=tuple(
            ranged(sources[i] if i < len(sources) else None, spec)
            for i, spec in enumerate(launch.args)
        ),
        params=tuple((name, ranged(name, spec) or spec) for name, spec in launch.params),
    )


def launch_specs_from_json(found: dict[str, Any]) -> LaunchSpecs:
    """The LaunchSpecs in the probe's JSON (what `probe_launch` read, or kept)."""
    return LaunchSpecs(
        args=tuple(None if s is None else spec_from_json(s) for s in found["args"]),
        params=tuple((name, spec_from_json(s)) for name, s in found["params"]),
        values=tuple((name, _tuples(value)) for name, value in found.get("values", ())),
        kernel=found.get("kernel"),
        integers=tuple((n, IntegerRange.from_json(r)) for n, r in found.get("integers", ())),
        launch=LaunchValues.from_json(found.get("launch") or {}),
        pointers=tuple(TensorPointer.from_json(p) for p in found.get("pointers", ())),
    )


def _tuples(value: Any) -> Any:
    """JSON wrote the probed tuples as lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
