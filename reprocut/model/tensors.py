"""The torch edge of the data model: TensorSpec from a real tensor, and a real tensor from a spec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from reprocut.model.case import (
    Arg,
    ArgList,
    Captured,
    Generated,
    Literal,
    Symbol,
    TensorSpec,
    Values,
    contiguous_stride,
)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


Layout = tuple[tuple[int, ...], tuple[int, ...] | None, int, torch.dtype, torch.device, bool]


def layout_of(tensor: torch.Tensor) -> Layout:
    """shape, stride, storage offset, dtype, device, requires_grad: `spec_from_layout`'s facts,
    read off the tensor now (cheap: no spec is built)."""
    strided = tensor.layout == torch.strided
    return (
        tuple(tensor.shape),
        tuple(tensor.stride()) if strided else None,
        tensor.storage_offset() if strided else 0,
        tensor.dtype,
        tensor.device,
        tensor.requires_grad,
    )


def spec_of(tensor: torch.Tensor, values: Values | None = None) -> TensorSpec:
    """The spec of a real tensor (its layout as it is, not as a contiguous copy; a sparse
    tensor with the specs of its parts, values generated)."""
    spec = spec_from_layout(*layout_of(tensor), values)
    if tensor.layout in SPARSE_LAYOUTS:
        parts = tuple(spec_of(part) for part in sparse_parts(tensor))
        spec = with_sparse_layout(spec, tensor, parts)
    return spec


SPARSE_LAYOUTS = {torch.sparse_coo: "sparse_coo", torch.sparse_csr: "sparse_csr"}


def sparse_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A sparse tensor's component tensors, in SPARSE_PARTS order, as stored: COO indices are
    read uncoalesced (`_indices`), so duplicates and their order stay as the user made them."""
    if tensor.layout == torch.sparse_coo:
        return tensor._indices(), tensor._values()
    if tensor.layout == torch.sparse_csr:
        return tensor.crow_indices(), tensor.col_indices(), tensor.values()
    raise ValueError(f"not a supported sparse layout: {tensor.layout}")


def with_sparse_layout(
    spec: TensorSpec, tensor: torch.Tensor, parts: tuple[TensorSpec, ...]
) -> TensorSpec:
    """`spec` (read off a sparse tensor) marked sparse, with its parts' specs."""
    coalesced = tensor.is_coalesced() if tensor.layout == torch.sparse_coo else None
    return replace(
        spec,
        stride=None,
        storage_offset=0,
        values=Generated("zeros"),
        layout=SPARSE_LAYOUTS[tensor.layout],
        parts=parts,
        coalesced=coalesced,
    )


def spec_from_layout(
    shape: tuple[int, ...],
    stride: tuple[int, ...] | None,
    storage_offset: int,
    dtype: torch.dtype,
    device: torch.device,
    requires_grad: bool,
    values: Values | None = None,
) -> TensorSpec:
    """The spec of a tensor from facts read off it earlier (the tensor may be gone by now)."""
    if stride is not None and stride == contiguous_stride(shape):
        stride = None
    return TensorSpec(
        shape=shape,
        stride=stride,
        storage_offset=storage_offset,
        dtype=dtype_name(dtype),
        device=str(device),
        requires_grad=requires_grad,
        values=values if values is not None else default_values(dtype),
    )


def default_values(dtype: torch.dtype) -> Generated:
    if dtype == torch.bool:
        return Generated("zeros")
    if dtype.is_floating_point or dtype.is_complex:
        return Generated("randn")
    return Generated("zeros")


def materialize(spec: TensorSpec, inputs: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Build the tensor a spec describes (values, dtype, device, layout, requires_grad)."""
    if spec.is_sparse:
        return _materialize_sparse(spec, inputs)
    dtype, device = to_dtype(spec.dtype), torch.device(spec.device)
    storage_numel = spec.storage_numel
    values = spec.values
    if isinstance(values, Captured):
        if inputs is None or values.key not in inputs:
            raise KeyError(f"captured tensor {values.key!r} is not in the inputs file")
        base = inputs[values.key].to(device=device, dtype=dtype)
        if tuple(base.shape) == spec.shape and spec.is_contiguous and spec.storage_offset == 0:
            tensor = base.clone()
        else:
            tensor = _lay_out(base.reshape(-1), spec, storage_numel)
    elif isinstance(values, Literal):
        flat = torch.tensor(values.values, dtype=dtype, device=device)
        tensor = _lay_out(flat, spec, storage_numel)
    else:
        flat = generate(values, storage_numel, dtype, device)
        tensor = flat.as_strided(
            spec.shape, spec.stride or contiguous_stride(spec.shape), spec.storage_offset
        )
    if spec.requires_grad and (dtype.is_floating_point or dtype.is_complex):
        tensor = tensor.detach().requires_grad_(True)
    return tensor


def _materialize_sparse(
    spec: TensorSpec, inputs: Mapping[str, torch.Tensor] | None
) -> torch.Tensor:
    """Sparse tensors are built from their parts as given: no invariant check (out-of-range
    indices are usually the bug), the COO coalesced flag as it was."""
    parts = [materialize(replace(p, device=spec.device), inputs) for p in spec.parts]
    dtype = to_dtype(spec.dtype)
    parts[-1] = parts[-1].to(dtype)
    grad = spec.requires_grad and (dtype.is_floating_point or dtype.is_complex)
    if spec.layout == "sparse_coo":
        extra = {} if spec.coalesced is None else {"is_coalesced": spec.coalesced}
        return torch.sparse_coo_tensor(
            *parts, spec.shape, check_invariants=False, requires_grad=grad, **extra
        )
    if spec.layout == "sparse_csr":
        return torch.sparse_csr_tensor(
            *parts, spec.shape, check_invariants=False, requires_grad=grad
        )
    raise ValueError(f"unknown layout {spec.layout!r}")


def _lay_out(flat: torch.Tensor, spec: TensorSpec, storage_numel: int) -> torch.Tensor:
    """Place row-major values into a storage laid out as the spec says."""
    if spec.is_contiguous and spec.storage_offset == 0:
        return flat[: spec.numel].reshape(spec.shape).clone()
    storage = torch.zeros(storage_numel, dtype=flat.dtype, device=flat.device)
    stride = spec.stride or contiguous_stride(spec.shape)
    if flat.numel() >= spec.numel and spec.numel:
        # Scatter by storage position: works for overlapping views (an expand()ed stride 0),
        # where copying into the view itself is refused.
        positions = torch.arange(storage_numel, device=flat.device).as_strided(
            spec.shape, stride, spec.storage_offset
        )
        storage[positions.reshape(-1)] = flat[: spec.numel]
    return storage.as_strided(spec.shape, stride, spec.storage_offset)


def generate(
    values: Generated, numel: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    kind = values.kind
    if kind == "empty":
        return torch.empty(numel, dtype=dtype, device=device)
    if kind == "zeros":
        return torch.zeros(numel, dtype=dtype, device=device)
    if kind == "ones":
        return torch.ones(numel, dtype=dtype, device=device)
    if kind == "full":
        return torch.full((numel,), values.low, dtype=dtype, device=device)
    if kind == "arange":
        return torch.arange(numel, device=device).to(dtype)
    if kind == "randint":
        return torch.randint(int(values.low), int(values.high), (numel,), device=device).to(dtype)
    if kind == "rand":
        return torch.rand(numel, device=device).to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(numel, dtype=dtype, device=device)
    return torch.zeros(numel, dtype=dtype, device=device)


def materialize_arg(arg: Arg, inputs: Mapping[str, torch.Tensor] | None = None) -> Any:
    """A ReproCase argument as the object to pass to torch."""
    if isinstance(arg, TensorSpec):
        return materialize(arg, inputs)
    if isinstance(arg, ArgList):
        return [materialize_arg(item, inputs) for item in arg.items]
    if isinstance(arg, Symbol):
        return resolve(arg.path)
    return arg


def resolve(path: str) -> Any:
    """`torch.nn.functional.embedding` -> the object (also `torch.ops.aten.x.default`)."""
    parts = path.split(".")
    if parts[0] != "torch":
        raise ValueError(f"not a torch path: {path!r}")
    obj: Any = torch
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj
