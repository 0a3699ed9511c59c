"""Facts about the values that reached a custom kernel, beyond the layout of its tensors.

A Triton or CuPy kernel checks nothing: what explains its illegal address is in the numbers it
was given. An id tensor whose largest value is past the rows of the table beside it ("id max
1099511627775 ≥ 65536 rows of `table`"), or a launch whose offsets, computed in int32, wrap
negative ("grid 2430976 × BLOCK 1024 reaches 2489319423, past 2**31 - 1"). An integer argument
is a fact only for what it is: one that falls inside a tensor the launching frame held is that
tensor's address (a CuPy kernel handed `x.data_ptr()`), said as such with its alignment, never
an offset that wraps; an int32 wrap needs an integer that can count into the tensors there (no
larger than the largest of them, in bytes). For a misaligned address, rows whose stride leaves
them off a 16-byte boundary are named. Takes what `reprocut.source.probe.probe_launch` (or the
blocking rerun) read at the failing launch; hands on facts by tensor name. Pure: no torch, no
process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from reprocut.check.memcheck import human_bytes
from reprocut.model.case import FLOAT_DTYPES, TensorSpec

if TYPE_CHECKING:  # the probe's results only: importing them here would load libcst at record
    from reprocut.source.launch_specs import (
        IntegerRange,
        LaunchSpecs,
        LaunchValues,
        TensorPointer,
    )

INT32_MAX = 2**31 - 1
VECTOR_BYTES = 16  # float4, int4, Triton's widest load: what a vectorized access aligns to
ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8,
              "complex128": 16, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
              "bool": 1}  # fmt: skip


def kernel_facts(
    probed: LaunchSpecs, tensors: Sequence[tuple[str, TensorSpec]], *, misaligned: bool = False
) -> dict[str, tuple[str, ...]]:
    """Facts per tensor name (the names of `tensors`: the launch's arguments and its function's
    tensor parameters; and of the tensors whose addresses reach the kernel as integers) from the
    values read at the launch. `misaligned`: the fault was a misaligned address, so rows that
    start off a 16-byte boundary are named."""
    facts: dict[str, list[str]] = {}
    for name, counted in probed.integers:
        facts.setdefault(name, []).extend(id_facts(name, counted, tensors))
    for name, found in pointer_facts(probed.launch, probed.pointers).items():
        facts.setdefault(name, []).extend(found)
    reaching = [*tensors, *((p.name, p.spec) for p in pointed(probed.launch, probed.pointers))]
    walked = _walked_tensor(tensors)
    if walked is not None or reaching:
        offsets = offset_facts(probed.launch, [spec for _, spec in reaching], probed.pointers)
        if offsets:
            facts.setdefault(walked or reaching[0][0], []).extend(offsets)
    if misaligned:
        addresses = {p.name: p.address for p in probed.pointers}
        for name, spec in dict(reaching).items():
            rows = row_alignment_fact(spec, addresses.get(name))
            if rows:
                facts.setdefault(name, []).append(rows)
    return {name: tuple(dict.fromkeys(found)) for name, found in facts.items() if found}


def id_facts(
    name: str, counted: IntegerRange, tensors: Sequence[tuple[str, TensorSpec]]
) -> tuple[str, ...]:
    """An integer tensor's range, against the rows of the largest floating tensor beside it
    (the table such ids index): the id past its last row, and how far past its end that row
    starts; a negative id."""
    table = _table(name, tensors)
    found = []
    if table is not None:
        table_name, spec = table
        rows = spec.shape[0]
        if counted.high >= rows:
            found.append(
                f"id max {counted.high} ≥ {rows} rows of `{table_name}` at {_at(counted.high_at)}"
            )
            past = _bytes_past_end(spec, counted.high)
            if past is not None:
                found.append(
                    f"row {counted.high} starts {human_bytes(past)} past the end of `{table_name}`"
                )
        if counted.low < 0:
            found.append(f"id {counted.low} < 0 at {_at(counted.low_at)}")
        if not found:
            found.append(
                f"{counted.numel} ids in [{counted.low}, {counted.high}], within the {rows} rows "
                f"of `{table_name}`"
            )
        return tuple(found)
    if counted.low < 0:
        found.append(f"id {counted.low} < 0 at {_at(counted.low_at)}")
    found.append(f"{counted.numel} values in [{counted.low}, {counted.high}]")
    return tuple(found)


def offset_facts(
    launch: LaunchValues,
    reaching: Sequence[TensorSpec] = (),
    pointers: Sequence[TensorPointer] = (),
) -> tuple[str, ...]:
    """Offsets a kernel computes from its launch, past what int32 holds: a Triton grid times its
    BLOCK constexpr, a CuPy grid times its block; else an integer argument past 2**31 - 1 that
    can count into the tensors `reaching` the kernel (none larger than the largest of them, in
    bytes) and is no address inside a tensor the frame held (`pointers`)."""
    programs, width, unit = _launch_extent(launch)
    if programs is not None and width is not None:
        top = programs * width - 1
        if top > INT32_MAX:
            first = (INT32_MAX + 1) // width  # the program holding offset 2**31
            return (
                f"grid {programs} × {unit} {width}: offsets reach {top}, past 2**31 - 1; "
                f"computed in int32 they wrap negative from program {first} on "
                f"(down to {-(INT32_MAX + 1)})",
            )
    extent = max((spec.storage_numel * _item_bytes(spec.dtype) for spec in reaching), default=0)
    large = [
        v for v in _launch_integers(launch)
        if INT32_MAX < v <= extent and not any(p.holds(v) for p in pointers)
    ]  # fmt: skip
    return tuple(
        f"integer argument {value} reaches the kernel, past 2**31 - 1 (an int32 offset wraps)"
        for value in dict.fromkeys(large)
    )


def pointer_facts(launch: LaunchValues, pointers: Sequence[TensorPointer]) -> dict[str, list[str]]:
    """Integer arguments that are tensors' addresses, by the tensor's name: the start of its
    data, or a place inside its storage, with the address's alignment; a CPU tensor's address
    beside GPU tensors' is host memory."""
    facts: dict[str, list[str]] = {}
    on_gpu = any(p.spec.device != "cpu" for p in pointers)
    for value in dict.fromkeys(_launch_integers(launch)):
        pointer = _pointer_for(value, pointers)
        if pointer is None:
            continue
        aligned = _alignment(value)
        if value == pointer.address:
            fact = f"its address ({value:#x}) reaches the kernel as an integer ({aligned})"
        else:
            into = value - pointer.storage_start
            fact = (
                f"an address {into} B into its storage ({value:#x}) reaches the kernel as an "
                f"integer ({aligned})"
            )
        if pointer.spec.device == "cpu" and on_gpu:
            fact += "; it is a CPU tensor: host memory, beside GPU tensors"
        facts.setdefault(pointer.name, []).append(fact)
    return facts


def pointed(launch: LaunchValues, pointers: Sequence[TensorPointer]) -> list[TensorPointer]:
    """The tensors whose addresses reach the kernel as integer arguments, in argument order."""
    found = [_pointer_for(v, pointers) for v in _launch_integers(launch)]
    return list({p.name: p for p in found if p is not None}.values())


def row_alignment_fact(spec: TensorSpec, address: int | None) -> str | None:
    """Rows (the last dim contiguous) whose stride in bytes is no multiple of 16: a 16-byte
    (float4) load at such a row's start is misaligned. `address`: where the view starts (else
    its storage offset, the storage itself taken as aligned, as allocators align it)."""
    item = ITEM_BYTES.get(spec.dtype)
    if item is None or spec.stride is None or len(spec.shape) < 2 or spec.stride[-1] != 1:
        return None
    rows, stride = spec.shape[-2], spec.stride[-2]
    row_bytes = stride * item
    if rows < 2 or row_bytes % VECTOR_BYTES == 0:
        return None
    start = address if address is not None else spec.storage_offset * item
    period = VECTOR_BYTES // math.gcd(row_bytes, VECTOR_BYTES)
    seen = min(period, rows)
    off = sum(1 for r in range(seen) if (start + r * row_bytes) % VECTOR_BYTES)
    which = f"{off} of every {period}" if rows >= period else f"{off} of its {rows}"
    return (
        f"rows {stride} elements ({row_bytes} B) apart: {which} rows start off a 16-byte "
        "boundary, where a 16-byte (float4) load of the row is misaligned"
    )


def _pointer_for(value: int, pointers: Sequence[TensorPointer]) -> TensorPointer | None:
    """The tensor whose data starts at `value`, else the one whose storage holds it."""
    exact = next((p for p in pointers if p.address == value and value), None)
    return exact or next((p for p in pointers if value and p.holds(value)), None)


def _alignment(address: int) -> str:
    rest = address % VECTOR_BYTES
    return "16-byte aligned" if not rest else f"{rest} B past a 16-byte boundary"


def _item_bytes(dtype: str) -> int:
    return ITEM_BYTES.get(dtype, 8)


def _launch_integers(launch: LaunchValues) -> list[int]:
    return [*_integers(launch.args), *(v for _, value in launch.keywords for v in _integers((value,)))]  # fmt: skip


def _launch_extent(launch: LaunchValues) -> tuple[int | None, int | None, str]:
    """Programs (blocks) along the grid's first axis and the elements each covers."""
    if launch.library == "triton" or launch.grid is not None:
        block = next(
            (v for name, v in launch.keywords if "BLOCK" in name.upper() and _is_int(v)), None
        )
        return _first(launch.grid), block, "BLOCK"
    if launch.library == "cupy" and len(launch.args) >= 2:
        return _first(launch.args[0]), _first(launch.args[1]), "block"
    return None, None, ""


def _first(value: Any) -> int | None:
    """The first axis of a grid or block: `n` or `(n, ...)`."""
    if isinstance(value, tuple) and value:
        value = value[0]
    return value if _is_int(value) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integers(values: Sequence[Any]) -> list[int]:
    found = []
    for value in values:
        if isinstance(value, tuple):
            found.extend(_integers(value))
        elif _is_int(value):
            found.append(value)
    return found


def _table(name: str, tensors: Sequence[tuple[str, TensorSpec]]) -> tuple[str, TensorSpec] | None:
    """The floating tensor with the most rows among the others (largest first on ties)."""
    tables = [(n, s) for n, s in tensors if n != name and s.dtype in FLOAT_DTYPES and s.shape]
    if not tables:
        return None
    return max(tables, key=lambda item: (item[1].shape[0], item[1].numel))


def _walked_tensor(tensors: Sequence[tuple[str, TensorSpec]]) -> str | None:
    """The tensor a launch's offsets walk: the first one too large for int32, else the first."""
    if not tensors:
        return None
    large = [n for n, s in tensors if s.storage_numel > INT32_MAX]
    return large[0] if large else tensors[0][0]


def _bytes_past_end(spec: TensorSpec, row: int) -> int | None:
    item = ITEM_BYTES.get(spec.dtype)
    if item is None or not spec.shape:
        return None
    row_stride = spec.stride[0] if spec.stride is not None else spec.numel // max(spec.shape[0], 1)
    start = (spec.storage_offset + row * row_stride) * item
    end = spec.storage_numel * item
    return start - end if start >= end else None


def _at(coords: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, coords)) + "]"
