"""Why an allocation is that big, from the failing op's inputs: shapes, strides and dtypes.

The op is run again on the meta device (no memory, no values) with tensors of the recorded
layouts, which gives the shape and dtype of what it had to allocate; comparing them with the
inputs names the reason in words: a broadcast, a quadratic intermediate (attention scores), a
dtype promotion, an expanded view made whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import torch

from reprocut.model.case import ArgList, ReproCase, Symbol, TensorSpec, contiguous_stride
from reprocut.model.oom import format_bytes
from reprocut.model.tensors import resolve, to_dtype

_SYMBOLS = {
    "add": "+",
    "sub": "-",
    "rsub": "-",
    "mul": "*",
    "div": "/",
    "pow": "**",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "bitwise_and": "&",
    "bitwise_or": "|",
}
_MATMULS = {"mm", "bmm", "baddbmm", "addmm", "matmul", "addbmm", "einsum", "_unsafe_view"}


def shape_text(shape: tuple[int, ...] | torch.Size) -> str:
    """(250000,) and (250000, 1), as Python writes tuples."""
    shape = tuple(shape)
    return f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"


def _meta(arg: Any) -> Any:
    if isinstance(arg, TensorSpec):
        stride = arg.stride or contiguous_stride(arg.shape)
        return torch.empty_strided(arg.shape, stride, dtype=to_dtype(arg.dtype), device="meta")
    if isinstance(arg, ArgList):
        return [_meta(item) for item in arg.items]
    if isinstance(arg, Symbol):
        return resolve(arg.path)
    return arg


def _outputs(result: Any) -> Iterator[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        yield result
    elif isinstance(result, (list, tuple)):
        for item in result:
            yield from _outputs(item)


def meta_outputs(case: ReproCase) -> list[torch.Tensor]:
    """The tensors `case`'s call returns, as meta tensors; [] when it cannot run on meta."""
    try:
        target = resolve(case.target)
        args = [_meta(a) for a in case.args]
        kwargs = {k: _meta(v) for k, v in case.kwargs}
        if "device" in kwargs:
            kwargs["device"] = "meta"
        return list(_outputs(target(*args, **kwargs)))
    except Exception:  # an op without a meta kernel, a case it does not understand
        return []


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _base(op: str | None) -> str:
    return (op or "").removeprefix("aten::").split(".")[0].rstrip("_")


def _stride0_dims(spec: TensorSpec) -> list[int]:
    stride = spec.stride or contiguous_stride(spec.shape)
    return [i for i, (s, n) in enumerate(zip(stride, spec.shape, strict=True)) if s == 0 and n > 1]


def explain_request(op: str | None, case: ReproCase | None, requested: int | None) -> list[str]:
    """Sentences that say why the failing op asked for that much memory."""
    if case is None:
        return []
    inputs = [spec for _, spec in case.tensors() if not spec.is_sparse]
    outputs = meta_outputs(case)
    largest = max(outputs, key=_nbytes, default=None)
    if largest is None:
        return []
    out_bytes, base = _nbytes(largest), _base(op)
    dtype = str(largest.dtype).removeprefix("torch.")
    made = f"{shape_text(largest.shape)} {dtype}: {format_bytes(out_bytes)}"
    sentences: list[str] = []
    biggest_input = max((s.numel for s in inputs), default=0)
    expanded = [s for s in inputs if _stride0_dims(s) and s.numel >= largest.numel() > 0]
    if base in _MATMULS and largest.dim() >= 2 and largest.shape[-1] == largest.shape[-2] > 1:
        contracted = min((s.shape[-1] for s in inputs if len(s.shape) >= 2), default=0)
        operands = " @ ".join(shape_text(s.shape) for s in inputs if len(s.shape) >= 2)
        size = largest.shape[-1]
        batched = largest.dim() >= 3  # (batch * heads, T, T): attention
        what, length = (
            ("attention scores", "the sequence length")
            if batched
            else ("pairwise scores", "the number of rows")
        )
        if contracted == 1:  # a column times a row: every entry with every other
            sentences.append(
                f"{operands} is an outer product: {shape_text(largest.shape)} {dtype}, "
                f"{format_bytes(out_bytes)}, quadratic in {length} {size}"
            )
        else:
            sentences.append(
                f"{operands} makes {shape_text(largest.shape)} {dtype} {what}: "
                f"{format_bytes(out_bytes)}, quadratic in {length} {size}"
                + (f" (the contracted dimension is only {contracted})" if contracted else "")
            )
    elif expanded:
        spec = expanded[0]
        real = spec.storage_numel
        dims = ", ".join(str(d) for d in _stride0_dims(spec))
        sentences.append(
            f"{shape_text(spec.shape)} is an expanded view of {real} element(s) (stride 0 in "
            f"dim {dims}); {op} writes all {largest.numel()} of them out: {made}"
        )
    elif largest.numel() > biggest_input and len(inputs) >= 2:
        symbol = _SYMBOLS.get(base)
        shapes = [shape_text(s.shape) for s in inputs]
        joined = f" {symbol} ".join(shapes) if symbol else f"{op} of " + " and ".join(shapes)
        sentences.append(f"{joined} broadcasts to {made}")
        if _column_against_vector(inputs):
            sentences.append(
                "an (n, 1) column against an (n,) vector pairs every element with every "
                "other: usually a shape mismatch (squeeze the column, or unsqueeze on purpose)"
            )
    else:
        sentences.append(f"{op} makes {made}")
    narrow = [
        s
        for s in inputs
        if s.numel == largest.numel() and to_dtype(s.dtype).itemsize < largest.element_size()
    ]
    if narrow:
        ratio = largest.element_size() // to_dtype(narrow[0].dtype).itemsize
        sentences.append(
            f"the {narrow[0].dtype} input {shape_text(narrow[0].shape)} is promoted to {dtype} "
            f"(type promotion with the other operand): {ratio}x its bytes per element"
        )
    if requested is not None and out_bytes and not math.isclose(requested, out_bytes, rel_tol=0.01):
        sentences.append(
            f"the failed request ({format_bytes(requested)}) is not the output's size: a "
            "temporary or workspace of the op"
        )
    return sentences


def _column_against_vector(inputs: list[TensorSpec]) -> bool:
    shapes = {spec.shape for spec in inputs}
    return any(len(s) == 2 and s[1] == 1 and (s[0],) in shapes for s in shapes)


def request_alone_too_big(
    requested: int | None, device_total: int | None, device: str, cpu_refused: bool
) -> bool:
    """Whether the request by itself exceeds what the device could ever give: then an op-level
    repro fails the same way anywhere; else the failure needed other memory held."""
    if requested is None:
        return False
    if device == "cpu":
        return cpu_refused
    return device_total is not None and requested > device_total


_LIBRARY_ALLOC = re.compile(r"(CUBLAS|CUDNN)_STATUS_ALLOC_FAILED(?: when calling `([^`]+)`)?")
_LIBRARIES = {"CUBLAS": "cuBLAS", "CUDNN": "cuDNN"}


def library_alloc_why(message: str, free: int | None, held: int | None) -> str | None:
    """A math library that could not allocate device memory of its own (its handle, its
    workspace): it asks the driver directly, past PyTorch's caching allocator, so the request's
    size is in no message; what was free and what PyTorch held say why."""
    match = _LIBRARY_ALLOC.search(message)
    if match is None:
        return None
    library, call = _LIBRARIES[match.group(1)], match.group(2)
    where = f" in `{call}`" if call else ""
    sentence = (
        f"{library} could not allocate device memory of its own{where}: it allocates from the "
        "driver, outside PyTorch's caching allocator"
    )
    figures = []
    if free is not None:
        figures.append(f"the device had {format_bytes(free)} free")
    if held:
        figures.append(f"PyTorch held {format_bytes(held)}")
    return sentence + (f", and {' while '.join(figures)}" if figures else "")
