"""Facts that explain a failure, from the culprit's real inputs, and a plain-language diagnosis.

"index max 1000 ≥ 1000 rows at [2, 3]" says more than any traceback. Each family in
research/bug-patterns.md gets a rule: which argument holds the evidence, which range it must lie in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reprocut.model.case import TensorSpec
from reprocut.model.tensors import spec_of, to_dtype
from reprocut.report.shapes import is_shape_mismatch, shape_diagnosis, shape_facts

INT32_MAX = 2**31 - 1
# Words of error messages that a tensor's strides, storage offset or alignment can explain
LAYOUT_WORDS = ("CUDA error", "CUBLAS", "cublas", "CUDNN", "cuDNN", "stride", "contiguous",
                "misaligned", "alignment", "illegal memory", "memory access", "Triton Error")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Explanation:
    facts: dict[int | str, tuple[str, ...]]  # argument position or kwarg name -> facts
    diagnosis: str
    family: str


def _where(tensor: torch.Tensor, flat_index: int) -> str:
    if tensor.dim() == 0:
        return "[]"
    coords = []
    for size in reversed(tensor.shape):
        coords.append(flat_index % size)
        flat_index //= size
    return "[" + ", ".join(str(c) for c in reversed(coords)) + "]"


def range_facts(
    tensor: torch.Tensor,
    low: int,
    high: int,
    *,
    what: str,
    unit: str,
    ignore: int | None = None,
) -> tuple[str, ...]:
    """Facts about integer values outside [low, high)."""
    values = tensor.detach().reshape(-1).to("cpu", torch.int64)
    valid = torch.ones_like(values, dtype=torch.bool) if ignore is None else values != ignore
    bad = ((values < low) | (values >= high)) & valid
    count = int(bad.sum())
    if count == 0:
        return (f"all {values.numel()} {what} values within [{low}, {high})",)
    facts = []
    high_bad = bad & (values >= high)
    if bool(high_bad.any()):
        top = int(values[high_bad].max())
        at = int(torch.nonzero(values == top)[0])
        facts.append(f"{what} max {top} ≥ {high} {unit} at {_where(tensor, at)}")
    low_bad = bad & (values < low)
    if bool(low_bad.any()):
        bottom = int(values[low_bad].min())
        at = int(torch.nonzero(values == bottom)[0])
        facts.append(f"{what} {bottom} < {low} at {_where(tensor, at)}")
    facts.append(f"{count} of {values.numel()} {what} values outside [{low}, {high})")
    return tuple(facts)


def probability_facts(
    tensor: torch.Tensor, *, lower: float = 0.0, upper: float | None = None
) -> tuple[str, ...]:
    values = tensor.detach().reshape(-1).to("cpu", torch.float64)
    nan = int(torch.isnan(values).sum())
    inf = int(torch.isinf(values).sum())
    finite = values[torch.isfinite(values)]
    facts = []
    if nan:
        at = int(torch.nonzero(torch.isnan(values))[0])
        facts.append(f"{nan} NaN (first at {_where(tensor, at)})")
    if inf:
        facts.append(f"{inf} inf")
    if finite.numel():
        low, high = float(finite.min()), float(finite.max())
        if low < lower:
            facts.append(f"min {low:.4g} < {lower:g}")
        if upper is not None and high > upper:
            at = int(torch.nonzero(values == high)[0])
            facts.append(f"input {high:.4g} outside [{lower:g}, {upper:g}] at {_where(tensor, at)}")
    if not facts:
        facts.append(f"all {values.numel()} values finite and in range")
    return tuple(facts)


def _arg(
    args: Sequence[Any], kwargs: dict[str, Any], index: int, name: str, default: Any = None
) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def _size(tensor: Any, dim: Any) -> int | None:
    if not isinstance(tensor, torch.Tensor) or not isinstance(dim, int):
        return None
    if tensor.dim() == 0:
        return 1
    return int(tensor.shape[dim])


DIAGNOSES = {
    "embedding": (
        "An index fed to an embedding is outside its table. Usual causes: a tokenizer that grew "
        "(added special tokens) without resizing the model's embeddings, a pad or label id such "
        "as -100 fed back as input, position ids beyond the maximum sequence length, or token-type "
        "ids beyond type_vocab_size. Compare the offending id with the table size above."
    ),
    "target": (
        "A class target is outside [0, num_classes). Usual causes: labels numbered from 1, a "
        "dataset with more classes than the model's output layer, an ignore value such as 255 "
        "(segmentation void) or -1 not passed as ignore_index."
    ),
    "index": (
        "An index tensor points outside the dimension it indexes (gather, scatter, index_select, "
        "index_add_, advanced indexing). Usual causes: edge lists or ids built for a larger "
        "graph or batch, off-by-one sizes, or indices from another tensor's numbering."
    ),
    "probability": (
        "The probabilities passed to sampling hold NaN, inf or negative values, or a row sums to "
        "zero. The NaN is usually born upstream: an overflow in fp16/bf16 logits, a division by "
        "zero in temperature or top-p filtering, or a softmax over a row that is all -inf."
    ),
    "bce": (
        "binary_cross_entropy needs inputs in [0, 1], but got values outside it (or NaN). Usual "
        "causes: raw logits passed instead of sigmoid outputs (use binary_cross_entropy_with_logits), "
        "or a NaN from an unstable layer upstream."
    ),
    "one_hot": (
        "one_hot got a class value ≥ num_classes (or negative). Pass num_classes explicitly and "
        "check the labels' range, or the number of classes the data really has."
    ),
    "unpool": (
        "max_unpool got indices that do not belong to an output of this size: indices from a "
        "different pooling layer or input size."
    ),
    "embedding_bag": (
        "embedding_bag's offsets or indices are invalid: offsets must start at 0, be "
        "non-decreasing and not exceed the number of indices; indices must lie in the table."
    ),
    "sparse": (
        "A sparse tensor stores indices outside its own size (a row or column id ≥ the "
        "dimension), built without an invariant check. Usual causes: ids from a larger graph, "
        "vocabulary or batch, or a size passed to sparse_coo_tensor that is too small; "
        "`torch.sparse.check_sparse_tensor_invariants()` makes the constructor raise at once."
    ),
    "layout": (
        "The fault happened in a kernel outside PyTorch's dispatcher (a Triton, CuPy or C++/CUDA "
        "kernel) or in a layout-sensitive library call. Such kernels often assume contiguous, "
        "aligned input: check the strides and storage offsets of the tensors reaching the launch "
        "(an expand()ed, transposed or sliced tensor)."
    ),
}


def explain(
    op: str | None,
    public_call: str | None,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    message: str = "",
) -> Explanation:
    """Facts per argument and a diagnosis for the op (or public call) that failed with
    `message`. Only facts that bear on the failure's class: a shape mismatch gets the
    dimension that disagrees, never the layout (F.linear always sees its weight transposed)."""
    name = (op or "").removeprefix("aten::")
    public = (public_call or "").rsplit(".", 1)[-1]
    if is_shape_mismatch(message):
        called = name or public
        return Explanation(
            facts=shape_facts(called, args, message),
            diagnosis=shape_diagnosis(called, args, kwargs),
            family="shape",
        )
    facts: dict[int | str, tuple[str, ...]] = {}
    family = "generic"

    if name == "embedding" or (not name and public == "embedding"):
        weight, indices = (args[0], args[1]) if name else (_arg(args, kwargs, 1, "weight"), args[0])
        position = 1 if name else 0
        if isinstance(weight, torch.Tensor) and isinstance(indices, torch.Tensor):
            facts[position] = range_facts(
                indices, 0, int(weight.shape[0]), what="index", unit="rows"
            )
        family = "embedding"
    elif name in (
        "nll_loss_forward",
        "nll_loss2d_forward",
        "nll_loss_backward",
        "nll_loss2d_backward",
    ) or (not name and public in ("cross_entropy", "nll_loss")):
        offset = 1 if name.endswith("backward") else 0
        logits = args[offset]
        target = args[offset + 1]
        ignore = (
            _arg(args, kwargs, offset + 4, "ignore_index", -100)
            if name
            else kwargs.get("ignore_index", -100)
        )
        if isinstance(logits, torch.Tensor) and isinstance(target, torch.Tensor):
            classes = int(logits.shape[1] if logits.dim() > 1 else logits.shape[0])
            if target.dtype.is_floating_point:
                facts[offset + 1] = ("target is floating point (class probabilities)",)
            else:
                facts[offset + 1] = range_facts(
                    target, 0, classes, what="target", unit="classes", ignore=ignore
                )
        family = "target"
    elif name in (
        "gather",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "scatter_reduce",
        "scatter_reduce_",
        "index_select",
        "index_add_",
        "index_add",
        "index_copy_",
        "index_fill_",
        "index_reduce_",
    ):
        source, dim, index = args[0], args[1], args[2]
        size = _size(source, dim)
        if size is not None and isinstance(index, torch.Tensor):
            facts[2] = range_facts(index, 0, size, what="index", unit=f"(size of dim {dim})")
        family = "index"
    elif name in ("index", "index_put_", "_index_put_impl_", "index_put"):
        source, indices = args[0], args[1]
        for dim, index in enumerate(indices or ()):
            if (
                isinstance(index, torch.Tensor)
                and not index.dtype.is_floating_point
                and index.dtype != torch.bool
            ):
                size = int(source.shape[dim])
                facts[f"1[{dim}]"] = range_facts(
                    index, -size, size, what="index", unit=f"(size of dim {dim})"
                )
        family = "index"
    elif name == "multinomial" or public == "multinomial":
        probs = args[0]
        if isinstance(probs, torch.Tensor):
            found_p = list(probability_facts(probs))
            if probs.dim() >= 1:
                sums = (
                    probs.detach().to("cpu", torch.float64).reshape(-1, probs.shape[-1]).nansum(-1)
                )
                zero_rows = int((sums <= 0).sum())
                if zero_rows:
                    found_p.append(f"{zero_rows} row(s) sum to ≤ 0")
            found_p.append(f"dtype {str(probs.dtype).removeprefix('torch.')}")
            facts[0] = tuple(found_p)
        family = "probability"
    elif name == "binary_cross_entropy" or public == "binary_cross_entropy":
        probs = args[0]
        if isinstance(probs, torch.Tensor):
            facts[0] = probability_facts(probs, lower=0.0, upper=1.0)
        family = "bce"
    elif (public == "one_hot" and not name) or name == "one_hot":
        labels = args[0]
        classes = _arg(args, kwargs, 1, "num_classes", -1)
        if isinstance(labels, torch.Tensor) and isinstance(classes, int) and classes > 0:
            facts[0] = range_facts(labels, 0, classes, what="class value", unit="classes")
        family = "one_hot"
    elif name in ("max_unpool2d", "max_unpool3d"):
        indices, output_size = args[1], args[2]
        if isinstance(indices, torch.Tensor):
            bound = math.prod(int(s) for s in output_size)
            facts[1] = range_facts(indices, 0, bound, what="max index", unit="output positions")
        family = "unpool"
    elif name in ("_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"):
        weight, indices, offsets = args[0], args[1], args[2]
        if isinstance(indices, torch.Tensor) and isinstance(weight, torch.Tensor):
            facts[1] = range_facts(indices, 0, int(weight.shape[0]), what="index", unit="rows")
        if isinstance(offsets, torch.Tensor) and isinstance(indices, torch.Tensor):
            off = offsets.detach().to("cpu", torch.int64).reshape(-1)
            found_o = []
            if off.numel() and int(off[0]) != 0:
                found_o.append(f"offsets[0] = {int(off[0])}, not 0")
            if off.numel() and int(off.max()) > indices.numel():
                found_o.append(f"offset {int(off.max())} > {indices.numel()} indices")
            if off.numel() > 1 and bool((off[1:] < off[:-1]).any()):
                found_o.append("offsets decrease")
            facts[2] = tuple(found_o) or ("offsets valid",)
        family = "embedding_bag"
    if not facts:
        facts = _generic_facts(args, layout=layout_bears_on(message))
    if family == "generic" and any(_is_sparse(a) and sparse_facts(a) for a in args):
        family = "sparse"
    diagnosis = DIAGNOSES.get(family, "")
    return Explanation(facts=facts, diagnosis=diagnosis, family=family)


def layout_facts(spec: TensorSpec) -> tuple[str, ...]:
    """What a kernel that walks memory as one flat, aligned buffer gets wrong about a tensor:
    stride-0 (expand()ed) dims, any other non-contiguous layout, more elements than int32
    offsets reach, a storage offset (and whether it leaves the data off a 16-byte boundary,
    which vectorized loads need)."""
    facts = []
    stride = spec.stride
    if stride is not None and not spec.is_contiguous:
        broadcast = [d for d, (n, s) in enumerate(zip(spec.shape, stride, strict=True))
                     if s == 0 and n > 1]  # fmt: skip
        if broadcast:
            dims = ", ".join(map(str, broadcast))
            facts.append(
                f"stride 0 in dim{'s' if len(broadcast) > 1 else ''} {dims} (an expand()ed view): {spec.numel} elements over "
                f"{spec.storage_numel} of storage"
            )
        else:
            facts.append(f"not contiguous: stride {tuple(stride)} for shape {spec.shape}")
    if spec.storage_numel > INT32_MAX:  # a kernel computing offsets in int32 wraps
        facts.append(f"{spec.storage_numel} elements, past 2**31 - 1 (int32 offsets wrap)")
    if spec.storage_offset:
        size = torch.empty((), dtype=to_dtype(spec.dtype)).element_size()
        offset = spec.storage_offset * size
        aligned = "16-byte aligned" if offset % 16 == 0 else "not 16-byte aligned"
        facts.append(f"storage offset {spec.storage_offset} ({offset} bytes: {aligned})")
    return tuple(facts)


def layout_bears_on(message: str) -> bool:
    """Whether strides, storage offsets and alignment can explain a failure with `message`:
    faults of kernels that walk memory (CUDA errors, cuBLAS, misaligned or illegal accesses)
    and errors about strides or contiguity; not a Python-level check such as a shape's (an
    unknown message keeps them)."""
    return not message or any(word in message for word in LAYOUT_WORDS)


def _generic_facts(args: Sequence[Any], *, layout: bool = True) -> dict[int | str, tuple[str, ...]]:
    """NaN/inf counts, integer ranges, and (`layout`) how a non-contiguous input is laid out."""
    facts: dict[int | str, tuple[str, ...]] = {}
    for position, value in enumerate(args):
        if _is_sparse(value):
            facts[position] = sparse_facts(value) or (f"{value.layout}, indices in range",)
            continue
        if not isinstance(value, torch.Tensor) or value.numel() == 0:
            continue
        if value.dtype.is_floating_point:
            data = value.detach().to("cpu", torch.float64)
            nan, inf = int(torch.isnan(data).sum()), int(torch.isinf(data).sum())
            if nan or inf:
                facts[position] = (f"{nan} NaN, {inf} inf",)
        elif value.dtype != torch.bool:
            data = value.detach().to("cpu", torch.int64)
            facts[position] = (f"values in [{int(data.min())}, {int(data.max())}]",)
        if layout and not value.is_contiguous():  # a kernel walking it as a flat buffer
            facts[position] = (*facts.get(position, ()), *layout_facts(spec_of(value)))
    return facts


def _is_sparse(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout in (torch.sparse_coo, torch.sparse_csr)


def sparse_facts(tensor: torch.Tensor) -> tuple[str, ...]:
    """Stored indices outside a sparse tensor's size: "column index max 53 ≥ 50 columns"."""
    if tensor.layout == torch.sparse_coo:
        indices = tensor._indices().detach().to("cpu", torch.int64)
        per_dim = [(d, indices[d]) for d in range(indices.shape[0])]
    else:
        per_dim = [(1, tensor.col_indices().detach().to("cpu", torch.int64))]
    facts = []
    names = {0: "row", 1: "column"} if tensor.dim() == 2 else {}
    for dim, ids in per_dim:
        if not ids.numel():
            continue
        size = int(tensor.shape[dim])
        what = f"{names.get(dim, f'dim {dim}')} index"
        high, low = int(ids.max()), int(ids.min())
        if high >= size:
            count = int((ids >= size).sum())
            facts.append(f"{what} max {high} ≥ size {size} ({count} of {ids.numel()} entries)")
        if low < 0:
            facts.append(f"{what} min {low} < 0")
    return tuple(facts)
