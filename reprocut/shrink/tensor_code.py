"""One TensorSpec -> the statements of repro.py that bind a variable to that tensor.

Literal values are written as nested lists, generated ones as torch.randn/arange/... calls,
Captured ones are loaded from the sidecar; a view whose stride or offset matters is built with
as_strided over a storage of its own. The emitter calls `tensor_statements` once per tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import libcst as cst

from reprocut.model.case import FLOAT_DTYPES, Captured, Generated, Literal, TensorSpec
from reprocut.model.errors import EmitError
from reprocut.shrink.nodes import assign, attribute_path, call, keyword, literal


def _shape(shape: tuple[int, ...]) -> cst.BaseExpression:
    return literal(tuple(shape))


def _nested(values: Sequence[Any], shape: tuple[int, ...]) -> Any:
    """Flat row-major values as nested lists of `shape` (so no reshape is needed)."""
    if not shape:
        return values[0]
    if len(shape) == 1:
        return list(values[: shape[0]])
    step = math.prod(shape[1:])
    return [_nested(values[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def _default_dtype(values: Sequence[Any]) -> str:
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int) for v in values):
        return "int64"
    return "float32"


def _tensor_kwargs(spec: TensorSpec, *, implied: str | None) -> dict[str, cst.BaseExpression]:
    kwargs: dict[str, cst.BaseExpression] = {}
    if spec.dtype != implied:
        kwargs["dtype"] = attribute_path(f"torch.{spec.dtype}")
    if spec.device != "cpu":
        kwargs["device"] = literal(spec.device)
    return kwargs


def _generator_call(values: Generated, shape: tuple[int, ...], spec: TensorSpec) -> cst.Call:
    kind = values.kind
    is_float = spec.dtype in FLOAT_DTYPES or spec.dtype.startswith("complex")
    if kind in ("randn", "rand") and not is_float:
        kind = "zeros"  # as tensors.generate does: no random normal integers
    kwargs = _tensor_kwargs(spec, implied="float32" if kind != "arange" else "int64")
    if kind in ("randn", "rand", "zeros", "ones"):
        return call(f"torch.{kind}", *(literal(s) for s in shape), **kwargs)
    if kind == "full":  # the fill value's type would pick the dtype: always name it
        kwargs = _tensor_kwargs(spec, implied=None)
        return call("torch.full", _shape(shape), literal(values.low), **kwargs)
    if kind == "randint":
        kwargs = _tensor_kwargs(spec, implied="int64")
        return call(
            "torch.randint", literal(int(values.low)), literal(int(values.high)), _shape(shape),
            **kwargs,
        )  # fmt: skip
    if kind == "arange":
        return call(
            cst.Attribute(call("torch.arange", literal(math.prod(shape)), **kwargs), cst.Name("reshape")),
            _shape(shape),
        )  # fmt: skip
    raise EmitError(f"unknown generator {values.kind!r}")


def _literal_tensor(values: Sequence[Any], spec: TensorSpec, shape: tuple[int, ...]) -> cst.Call:
    flat = list(values)
    if len(flat) < math.prod(shape):
        raise EmitError(f"literal has {len(flat)} values for shape {shape}")
    data = _nested(flat, shape)
    if not shape or math.prod(shape) > 0:
        return call(
            "torch.tensor", literal(data), **_tensor_kwargs(spec, implied=_default_dtype(flat))
        )
    kwargs = _tensor_kwargs(spec, implied="float32")
    return call("torch.empty", *(literal(s) for s in shape), **kwargs)


def _empty_call(spec: TensorSpec) -> cst.Call:
    """No values, only the layout: `torch.empty` for a contiguous tensor, `torch.empty_strided`
    for a strided one (an expanded view keeps its stride 0 and stays small)."""
    kwargs = _tensor_kwargs(spec, implied="float32")
    if spec.storage_offset:  # empty_strided has no offset: a view into a storage of its own
        storage = call("torch.empty", literal(spec.storage_numel), **kwargs)
        return _as_strided(storage, spec)
    if spec.is_contiguous:
        return _with_grad(call("torch.empty", _shape(spec.shape), **kwargs), spec)
    stride = literal(tuple(spec.stride or ()))
    return _with_grad(call("torch.empty_strided", _shape(spec.shape), stride, **kwargs), spec)


def _with_grad(call: cst.Call, spec: TensorSpec) -> cst.Call:
    if spec.requires_grad and spec.dtype in FLOAT_DTYPES:
        return call.with_changes(args=[*call.args, keyword("requires_grad", cst.Name("True"))])
    return call


def tensor_statements(name: str, spec: TensorSpec) -> list[cst.BaseStatement]:
    """Statements that bind `name` to the tensor `spec` describes (Captured must be sidecar'd)."""
    if spec.is_sparse:
        return _sparse_statements(name, spec)
    target = cst.Name(name)
    plain = spec.is_contiguous and spec.storage_offset == 0
    values = spec.values
    if isinstance(values, Generated) and values.kind == "empty":
        return [assign(target, _empty_call(spec))]
    if isinstance(values, Captured):
        loaded = cst.Subscript(
            value=cst.Name("inputs"),
            slice=[cst.SubscriptElement(cst.Index(literal(values.key)))],
        )
        value: cst.BaseExpression = call(
            cst.Attribute(loaded, cst.Name("to")), **_tensor_kwargs(spec, implied=None)
        )
        if plain:
            return [assign(target, value)]
        fill = value
    elif isinstance(values, Literal):
        if plain:
            return [
                assign(target, _with_grad(_literal_tensor(values.values, spec, spec.shape), spec))
            ]
        fill = _literal_tensor(values.values, spec, spec.shape)
    else:
        if plain:
            return [assign(target, _with_grad(_generator_call(values, spec.shape, spec), spec))]
        storage = _generator_call(values, (spec.storage_numel,), spec)
        return [assign(target, _as_strided(storage, spec))]
    # a view with a stride or offset that matters: zeros storage, then the real values copied in
    storage = call(
        "torch.zeros", literal(spec.storage_numel), **_tensor_kwargs(spec, implied="float32")
    )
    if _overlaps(spec):
        return _overlapping_view(name, storage, fill, spec)
    copy = call(cst.Attribute(target, cst.Name("copy_")), fill)
    return [assign(target, _as_strided(storage, spec)), cst.SimpleStatementLine([cst.Expr(copy)])]


SPARSE_CONSTRUCTORS = {
    "sparse_coo": "torch.sparse_coo_tensor",
    "sparse_csr": "torch.sparse_csr_tensor",
}


def _sparse_statements(name: str, spec: TensorSpec) -> list[cst.BaseStatement]:
    """`x_indices = ...`, `x_values = ...`, then `x = torch.sparse_coo_tensor(...)`: the parts
    as dense tensors (the index values as recorded: they are usually the bug), built without
    an invariant check, so out-of-range indices reach the op as they did in the user's run."""
    constructor = SPARSE_CONSTRUCTORS.get(spec.layout)
    if constructor is None:
        raise EmitError(f"no constructor for layout {spec.layout!r}")
    body: list[cst.BaseStatement] = []
    names = []
    for part_name, part in zip(spec.part_names, spec.parts, strict=True):
        part = replace(part, device=spec.device, requires_grad=False)
        if part_name == "values":
            part = replace(part, dtype=spec.dtype)
        names.append(cst.Name(f"{name}_{part_name}"))
        body.extend(tensor_statements(names[-1].value, part))
    kwargs: dict[str, cst.BaseExpression] = {"check_invariants": cst.Name("False")}
    if spec.layout == "sparse_coo" and spec.coalesced:
        kwargs["is_coalesced"] = cst.Name("True")
    if spec.requires_grad and spec.dtype in FLOAT_DTYPES:
        kwargs["requires_grad"] = cst.Name("True")
    body.append(assign(cst.Name(name), call(constructor, *names, _shape(spec.shape), **kwargs)))
    return body


def _overlaps(spec: TensorSpec) -> bool:
    """Elements share storage (an expand()ed stride 0): copying into such a view is refused."""
    stride = spec.stride or ()
    return any(step == 0 and size > 1 for size, step in zip(spec.shape, stride, strict=False))


def _overlapping_view(
    name: str, storage: cst.BaseExpression, fill: cst.BaseExpression, spec: TensorSpec
) -> list[cst.BaseStatement]:
    """`x_storage[positions] = values` writes each storage element once, then the view."""
    storage_name = cst.Name(f"{name}_storage")
    positions = _as_strided(call("torch.arange", literal(spec.storage_numel)), spec)
    index = call(cst.Attribute(positions, cst.Name("reshape")), literal(-1))
    flat = call(cst.Attribute(fill, cst.Name("reshape")), literal(-1))
    scatter = cst.Subscript(value=storage_name, slice=[cst.SubscriptElement(cst.Index(index))])
    return [
        assign(storage_name, storage),
        assign(scatter, flat),
        assign(cst.Name(name), _as_strided(storage_name, spec)),
    ]


def _as_strided(storage: cst.BaseExpression, spec: TensorSpec) -> cst.Call:
    stride = spec.stride if spec.stride is not None else _contiguous(spec.shape)
    args = [_shape(spec.shape), literal(tuple(stride))]
    if spec.storage_offset:
        args.append(literal(spec.storage_offset))
    return call(cst.Attribute(storage, cst.Name("as_strided")), *args)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    from reprocut.model.case import contiguous_stride

    return contiguous_stride(shape)
