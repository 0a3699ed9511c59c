"""Facts about the values that reached a custom kernel, beyond the layout of its tensors.

A Triton or CuPy kernel checks nothing: what explains its illegal address is in the numbers it
was given. An id tensor whose largest value is past the rows of the table beside it ("id max
1099511627775 ≥ 65536 rows of `table`"), or a launch whose offsets, computed in int32, wrap
negative ("grid 2430976 × BLOCK 1024 reaches 2489319423, past 2**31 - 1"). Takes what
`reprocut.source.probe.probe_launch` read at the failing launch; hands on facts by tensor name.
Pure: no torch, no process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from reprocut.check.memcheck import human_bytes
from reprocut.model.case import FLOAT_DTYPES, TensorSpec

if TYPE_CHECKING:  # the probe's results only: importing them here would load libcst at record
    from reprocut.source.launch_specs import IntegerRange, LaunchSpecs, LaunchValues

INT32_MAX = 2**31 - 1
ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8}


def kernel_facts(
    probed: LaunchSpecs, tensors: Sequence[tuple[str, TensorSpec]]
) -> dict[str, tuple[str, ...]]:
    """Facts per tensor name (the names of `tensors`: the launch's arguments and its function's
    tensor parameters) from the values read at the launch."""
    facts: dict[str, list[str]] = {}
    for name, counted in probed.integers:
        facts.setdefault(name, []).extend(id_facts(name, counted, tensors))
    walked = _walked_tensor(tensors)
    if walked is not None:
        offsets = offset_facts(probed.launch)
        if offsets:
            facts.setdefault(walked, []).extend(offsets)
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


def offset_facts(launch: LaunchValues) -> tuple[str, ...]:
    """Offsets a kernel computes from its launch, past what int32 holds: a Triton grid times its
    BLOCK constexpr, a CuPy grid times its block; else any integer argument past 2**31 - 1."""
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
    large = [v for v in _integers(launch.args) if v > INT32_MAX]
    large += [v for _, value in launch.keywords for v in _integers((value,)) if v > INT32_MAX]
    return tuple(
        f"integer argument {value} reaches the kernel, past 2**31 - 1 (an int32 offset wraps)"
        for value in dict.fromkeys(large)
    )


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
