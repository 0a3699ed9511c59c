"""The data model every stage shares: tensors as specs, a failing call as a ReproCase.

Frozen, hashable and JSON-serializable, so the shrinker can keep a best-so-far, compare candidates
and save each accepted one to disk. Imports no other reprocut module and never imports torch:
dtypes and devices are strings here and become torch objects only at the edges.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Union

Number = int | float | bool


# --- where a tensor's values come from -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Captured:
    """Real values captured from the user's run, stored under `key` in the run's inputs file."""

    key: str


@dataclass(frozen=True, slots=True)
class Literal:
    """Values written into the repro itself, flat in row-major order of the tensor's shape."""

    values: tuple[Number, ...]


@dataclass(frozen=True, slots=True)
class Generated:
    """Values made by a generator, when only the shape (or a range) matters.

    kind: "randn", "rand", "zeros", "ones", "full" (`low` is the fill), "randint" ([low, high)),
    "arange", or "empty" (no values: an out-of-memory repro needs the layout alone).
    """

    kind: str = "randn"
    low: Number = 0
    high: Number = 1


Values = Captured | Literal | Generated
RANDOM_KINDS = frozenset({"randn", "rand", "randint"})  # random values: a repro seeds first

DTYPE_RANK = {
    # simpler dtypes first: the shrinker moves toward the front of this list
    "float32": 0,
    "int64": 1,
    "bool": 2,
    "int32": 3,
    "float64": 4,
    "float16": 5,
    "bfloat16": 6,
    "int16": 7,
    "int8": 8,
    "uint8": 9,
    "complex64": 10,
}
FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16"}
INT_DTYPES = {"int64", "int32", "int16", "int8", "uint8"}


# the component tensors of each sparse layout, in constructor order (values last)
SPARSE_PARTS = {
    "sparse_coo": ("indices", "values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
}


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The row-major strides of a contiguous tensor of `shape`."""
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(size, 1)
    return tuple(reversed(stride))


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Everything needed to rebuild one tensor argument: layout, dtype, device and values.

    A sparse tensor (`layout` "sparse_coo" or "sparse_csr") keeps its size in `shape` and its
    component tensors in `parts` (SPARSE_PARTS order: index tensors, then values), each a dense
    spec of its own with values captured where they matter (the indices); `values`, `stride`
    and `storage_offset` of the sparse spec itself are unused.
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None  # None means contiguous
    storage_offset: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    requires_grad: bool = False
    values: Values = field(default_factory=Generated)
    layout: str = "strided"
    parts: tuple[TensorSpec, ...] = ()
    coalesced: bool | None = None  # sparse COO: the tensor's is_coalesced() flag

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_sparse(self) -> bool:
        return self.layout != "strided"

    @property
    def part_names(self) -> tuple[str, ...]:
        return SPARSE_PARTS.get(self.layout, ())

    def part(self, name: str) -> TensorSpec:
        """A sparse tensor's component (`indices`, `col_indices`, `values`, ...)."""
        return self.parts[self.part_names.index(name)]

    def with_part(self, name: str, new: TensorSpec) -> TensorSpec:
        index = self.part_names.index(name)
        return replace(self, parts=(*self.parts[:index], new, *self.parts[index + 1 :]))

    @property
    def stored_numel(self) -> int:
        """Elements this tensor costs in a repro: a dense tensor's own, a sparse one's size
        (shrinking it is progress) plus the elements of its parts."""
        return self.numel + sum(part.numel for part in self.parts)

    @property
    def is_contiguous(self) -> bool:
        return self.stride is None or tuple(self.stride) == contiguous_stride(self.shape)

    @property
    def storage_numel(self) -> int:
        """Elements the underlying storage must hold for this view (offset included)."""
        if self.is_contiguous:
            return self.storage_offset + self.numel
        if self.numel == 0:
            return self.storage_offset
        assert self.stride is not None
        span = sum((size - 1) * step for size, step in zip(self.shape, self.stride, strict=True))
        return self.storage_offset + span + 1

    def complexity(self) -> tuple[int, int, int, int]:
        """Smaller is simpler: dtype rank, non-contiguous, offset, device (cuda > cpu)."""
        return (
            DTYPE_RANK.get(self.dtype, len(DTYPE_RANK)),
            0 if self.is_contiguous else 1,
            self.storage_offset,
            0 if self.device == "cpu" else 1,
        )


@dataclass(frozen=True, slots=True)
class Symbol:
    """A torch attribute passed as an argument, such as `torch.float16` or `torch.channels_last`."""

    path: str  # "torch.float16"


# An argument: a tensor, a Python scalar (None, bool, int, float, str), a torch symbol, or a list.
Arg = Union[TensorSpec, Symbol, "ArgList", None, bool, int, float, str]


@dataclass(frozen=True, slots=True)
class ArgList:
    """A list or tuple argument (`dims`, `TensorList`), kept as a tuple so the case stays hashable."""

    items: tuple[Arg, ...]


# --- what "the same failure" means ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Signature:
    """The identity of a failure that must survive shrinking.

    Never the kernel name: the same out-of-range lookup asserts in different kernels by shape.
    `op` is the aten op that raised (or the public call, where no aten op did); `kind` is the
    normalized assertion or message (numbers removed).
    """

    error_type: str  # "IndexError", "RuntimeError", "AcceleratorError"
    error_code: int | None  # 710 device-side assert, 700 illegal address; None off CUDA
    op: str | None  # "aten::embedding"
    kind: str  # "index out of bounds", "Target <n> is out of bounds."

    def matches(self, other: Signature, *, compare_op: bool = True) -> bool:
        """Same bug? CUDA errors compare by code and kind (their Python type changed across
        torch releases); others by type and kind. The op is compared when both sides know it."""
        if compare_op and self.op and other.op and self.op != other.op:
            return False
        if self.error_code is not None or other.error_code is not None:
            return self.error_code == other.error_code and self.kind == other.kind
        return self.error_type == other.error_type and self.kind == other.kind

    def describe(self) -> str:
        if self.error_type == "Crash":  # a process that died without an exception
            return f"a crash ({self.kind})"
        code = f" (CUDA error {self.error_code})" if self.error_code is not None else ""
        where = f" in {self.op}" if self.op else ""
        return f"{self.error_type}{code}{where}: {self.kind}"


# --- the failing call -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceLocation:
    file: str
    line: int
    text: str = ""
    function: str = ""

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class ReproCase:
    """One failing call: what to call, with which arguments, and which failure it must raise.

    `target` is a public dotted path: `torch.nn.functional.embedding`, `torch.gather`, a method
    as `torch.Tensor.scatter_add_` (called on the first argument), or `torch.ops.aten.X.overload`
    where no public function fits.
    """

    target: str
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...] = ()
    expected: Signature | None = None
    aten_op: str | None = None  # the aten op that faulted in the user's run
    source: SourceLocation | None = None  # where the user's code made the call
    inputs_file: str | None = None  # file holding Captured values, relative to the case's run dir
    # set at the top of repro.py before torch is imported: only what the failure needs
    # (CUDA_LAUNCH_BLOCKING where it does not reproduce without blocking launches)
    env: tuple[tuple[str, str], ...] = ()
    # a non-finite origin (`record --nan`): the repro ends by raising if the call's floating
    # outputs hold NaN or inf (model.signature.nonfinite_signature is what it raises)
    check_finite: bool = False
    definitions: str = ""  # code defining a custom op the call needs (torch.ops.<ns> not aten)

    def tensors(self) -> Iterator[tuple[tuple[Any, ...], TensorSpec]]:
        """Every tensor argument with its path: ("args", i[, j...]) or ("kwargs", name[, j...])."""
        for index, arg in enumerate(self.args):
            yield from _tensors_in(arg, ("args", index))
        for name, arg in self.kwargs:
            yield from _tensors_in(arg, ("kwargs", name))

    def total_numel(self) -> int:
        return sum(spec.stored_numel for _, spec in self.tensors())

    def num_captured_values(self) -> int:
        total = 0
        for _, top in self.tensors():
            for spec in (top, *top.parts):
                if isinstance(spec.values, Captured):
                    total += spec.numel
                elif isinstance(spec.values, Literal):
                    total += len(spec.values.values)
        return total

    def num_args(self) -> int:
        return len(self.args) + len(self.kwargs)

    def get(self, path: tuple[Any, ...]) -> Arg:
        head, key, *rest = path
        arg = self.args[key] if head == "args" else dict(self.kwargs)[key]
        for index in rest:
            assert isinstance(arg, ArgList)
            arg = arg.items[index]
        return arg

    def with_arg(self, path: tuple[Any, ...], new: Arg) -> ReproCase:
        """A copy with the argument at `path` replaced."""
        head, key, *rest = path
        if head == "args":
            args = list(self.args)
            args[key] = _replace_in(args[key], rest, new)
            return replace(self, args=tuple(args))
        kwargs = tuple(
            (name, _replace_in(value, rest, new) if name == key else value)
            for name, value in self.kwargs
        )
        return replace(self, kwargs=kwargs)

    def without_kwarg(self, name: str) -> ReproCase:
        return replace(self, kwargs=tuple(kv for kv in self.kwargs if kv[0] != name))

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "args": [arg_to_json(arg) for arg in self.args],
            "kwargs": [[name, arg_to_json(arg)] for name, arg in self.kwargs],
            "expected": signature_to_json(self.expected),
            "aten_op": self.aten_op,
            "source": None if self.source is None else self.source.to_json(),
            "inputs_file": self.inputs_file,
            "env": [list(pair) for pair in self.env],
            "check_finite": self.check_finite,
            **({"definitions": self.definitions} if self.definitions else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReproCase:
        return cls(
            target=data["target"],
            args=tuple(arg_from_json(arg) for arg in data["args"]),
            kwargs=tuple((name, arg_from_json(arg)) for name, arg in data["kwargs"]),
            expected=signature_from_json(data.get("expected")),
            aten_op=data.get("aten_op"),
            source=None if data.get("source") is None else SourceLocation(**data["source"]),
            inputs_file=data.get("inputs_file"),
            env=tuple((str(k), str(v)) for k, v in data.get("env", ())),
            check_finite=data.get("check_finite", False),
            definitions=data.get("definitions", ""),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, allow_nan=False)

    @classmethod
    def loads(cls, text: str) -> ReproCase:
        return cls.from_json(json.loads(text))


def _tensors_in(arg: Arg, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], TensorSpec]]:
    if isinstance(arg, TensorSpec):
        yield path, arg
    elif isinstance(arg, ArgList):
        for index, item in enumerate(arg.items):
            yield from _tensors_in(item, (*path, index))


def _replace_in(arg: Arg, rest: list[Any], new: Arg) -> Arg:
    if not rest:
        return new
    assert isinstance(arg, ArgList)
    items = list(arg.items)
    items[rest[0]] = _replace_in(items[rest[0]], rest[1:], new)
    return ArgList(tuple(items))


# --- JSON ------------------------------------------------------------------------------------


def number_to_json(value: Number) -> Any:
    """JSON has no NaN or infinity: those become {"float": "nan"} and friends."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    return value


def number_from_json(data: Any) -> Number:
    if isinstance(data, dict):
        return float(data["float"])
    return data


def values_to_json(values: Values) -> dict[str, Any]:
    if isinstance(values, Captured):
        return {"captured": values.key}
    if isinstance(values, Literal):
        return {"literal": [number_to_json(v) for v in values.values]}
    return {
        "generated": values.kind,
        "low": number_to_json(values.low),
        "high": number_to_json(values.high),
    }


def values_from_json(data: dict[str, Any]) -> Values:
    if "captured" in data:
        return Captured(data["captured"])
    if "literal" in data:
        return Literal(tuple(number_from_json(v) for v in data["literal"]))
    return Generated(
        data["generated"], number_from_json(data["low"]), number_from_json(data["high"])
    )


def spec_to_json(spec: TensorSpec) -> dict[str, Any]:
    data = {
        "shape": list(spec.shape),
        "stride": None if spec.stride is None else list(spec.stride),
        "storage_offset": spec.storage_offset,
        "dtype": spec.dtype,
        "device": spec.device,
        "requires_grad": spec.requires_grad,
        "values": values_to_json(spec.values),
    }
    if spec.is_sparse:  # dense specs keep the JSON they always had
        data["layout"] = spec.layout
        data["parts"] = [spec_to_json(part) for part in spec.parts]
        data["coalesced"] = spec.coalesced
    return data


def spec_from_json(data: dict[str, Any]) -> TensorSpec:
    return TensorSpec(
        shape=tuple(data["shape"]),
        stride=None if data.get("stride") is None else tuple(data["stride"]),
        storage_offset=data.get("storage_offset", 0),
        dtype=data.get("dtype", "float32"),
        device=data.get("device", "cpu"),
        requires_grad=data.get("requires_grad", False),
        values=values_from_json(data.get("values", {"generated": "randn", "low": 0, "high": 1})),
        layout=data.get("layout", "strided"),
        parts=tuple(spec_from_json(part) for part in data.get("parts", ())),
        coalesced=data.get("coalesced"),
    )


def arg_to_json(arg: Arg) -> Any:
    if isinstance(arg, TensorSpec):
        return {"tensor": spec_to_json(arg)}
    if isinstance(arg, Symbol):
        return {"symbol": arg.path}
    if isinstance(arg, ArgList):
        return {"list": [arg_to_json(item) for item in arg.items]}
    if isinstance(arg, float):
        return {"float": repr(arg)}  # keeps float-ness (1.0 vs 1) and NaN
    return arg


def arg_from_json(data: Any) -> Arg:
    if isinstance(data, dict):
        if "tensor" in data:
            return spec_from_json(data["tensor"])
        if "symbol" in data:
            return Symbol(data["symbol"])
        if "list" in data:
            return ArgList(tuple(arg_from_json(item) for item in data["list"]))
        if "float" in data:
            return float(data["float"])
        raise ValueError(f"unknown argument encoding: {data!r}")
    return data


def signature_to_json(signature: Signature | None) -> dict[str, Any] | None:
    return None if signature is None else asdict(signature)


def signature_from_json(data: dict[str, Any] | None) -> Signature | None:
    return None if data is None else Signature(**data)
