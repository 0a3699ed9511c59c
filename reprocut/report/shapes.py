"""Facts for a shape mismatch: which dimension of which input disagrees, and with what.

A failure's facts must bear on its class: for "mat1 and mat2 shapes cannot be multiplied" the
inner dimensions of the product are the evidence, not the weight's transposed strides (F.linear
always sees its weight transposed). The rules read the shapes of the culprit's real inputs: the
aten call's (mm, addmm, bmm, mv, broadcasting, view, convolution) for the facts, the public
call's (F.linear, torch.matmul) for the diagnosis, since that is the call the user wrote.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

# Fragments of PyTorch's shape-mismatch messages (matmul, broadcasting, view, cat, conv, mv, bmm)
SHAPE_MESSAGES = (
    "shapes cannot be multiplied",
    "must match the size of tensor",
    "is invalid for input of size",
    "Sizes of tensors must match",
    "size mismatch",
    "Expected size for first two dimensions",
    "channels, but got",
    "inconsistent tensor size",
)

GENERIC = (
    "The inputs' shapes do not fit the call: the dimension that disagrees is named above. "
    "Find where that tensor was last reshaped (view, reshape, flatten, permute), or the layer "
    "size that assumed another shape."
)


def is_shape_mismatch(message: str) -> bool:
    """Whether an error message says that the inputs' shapes do not fit together."""
    return any(fragment in message for fragment in SHAPE_MESSAGES)


def _shape(tensor: torch.Tensor) -> str:
    return str(tuple(tensor.shape))


def _tensors(*values: Any) -> bool:
    return all(isinstance(v, torch.Tensor) for v in values)


def shape_facts(
    name: str, args: Sequence[Any], message: str = ""
) -> dict[int | str, tuple[str, ...]]:
    """Per argument position: the dimension that disagrees, for the aten op or public call
    `name` (its last part: `addmm`, `linear`)."""
    if name == "linear" and len(args) > 1 and _tensors(args[0], args[1]):
        inputs, weight = args[0], args[1]
        if weight.dim() == 2 and inputs.dim() >= 1 and inputs.shape[-1] != weight.shape[1]:
            return {0: (f"last dim {inputs.shape[-1]} of {_shape(inputs)} ≠ the {weight.shape[1]} "
                        f"in_features of the weight {_shape(weight)}",)}  # fmt: skip
        return {}
    if name == "matmul" and len(args) > 1 and _tensors(args[0], args[1]):
        a, b = args[0], args[1]
        inner = int(b.shape[-2] if b.dim() >= 2 else b.shape[0]) if b.dim() else None
        if a.dim() and inner is not None and int(a.shape[-1]) != inner:
            return {0: (f"last dim {a.shape[-1]} of {_shape(a)} ≠ the {inner} rows of the next "
                        f"argument {_shape(b)}",)}  # fmt: skip
        return {}
    if name in ("mm", "addmm", "_addmm_activation", "mv", "addmv"):
        first = 0 if name in ("mm", "mv") else 1
        if len(args) > first + 1 and _tensors(args[first], args[first + 1]):
            return _inner(args[first], args[first + 1], first)
    if name in ("bmm", "baddbmm"):
        first = 0 if name == "bmm" else 1
        if len(args) > first + 1 and _tensors(args[first], args[first + 1]):
            return _batched(args[first], args[first + 1], first)
    if name in ("view", "reshape", "_unsafe_view", "_reshape_alias") and len(args) > 1:
        return _view(args[0], args[1])
    if name in ("convolution", "_convolution", "conv1d", "conv2d", "conv3d") and len(args) > 1:
        at = 8 if name in ("convolution", "_convolution") else 6  # where `groups` goes
        groups = args[at] if len(args) > at else 1
        return _channels(args[0], args[1], groups if isinstance(groups, int) else 1)
    tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if len(tensors) >= 2 and "must match the size of tensor" in message:  # elementwise
        return _broadcast(tensors[0], tensors[1][1])
    return {}


def _inner(a: torch.Tensor, b: torch.Tensor, first: int) -> dict[int | str, tuple[str, ...]]:
    """A matrix (or matrix-vector) product: a's columns against b's rows."""
    if a.dim() != 2 or b.dim() < 1 or a.shape[1] == b.shape[0]:
        return {}
    columns, rows = int(a.shape[1]), int(b.shape[0])
    return {
        first: (f"{columns} columns (dim 1) ≠ the {rows} rows of the next argument {_shape(b)}",),
        first + 1: (f"{rows} rows (dim 0) ≠ the {columns} columns of the previous argument "
                    f"{_shape(a)}",),
    }  # fmt: skip


def _batched(a: torch.Tensor, b: torch.Tensor, first: int) -> dict[int | str, tuple[str, ...]]:
    if a.dim() != 3 or b.dim() != 3:
        return {}
    found: dict[int | str, tuple[str, ...]] = {}
    if a.shape[0] != b.shape[0]:
        found[first] = (f"batch {a.shape[0]} of {_shape(a)} ≠ {b.shape[0]} of the next argument",)
    if a.shape[2] != b.shape[1]:
        found[first] = (*found.get(first, ()),
                        f"{a.shape[2]} columns (dim 2) ≠ the {b.shape[1]} rows (dim 1) of the "
                        f"next argument {_shape(b)}")  # fmt: skip
    return found


def _view(tensor: Any, size: Any) -> dict[int | str, tuple[str, ...]]:
    if not isinstance(tensor, torch.Tensor) or not isinstance(size, (list, tuple)):
        return {}
    sizes = [int(s) for s in size if isinstance(s, int)]
    if len(sizes) != len(size):
        return {}
    known = math.prod(s for s in sizes if s != -1)
    numel = tensor.numel()
    if -1 in sizes:
        if known and numel % known == 0:
            return {}
        return {0: (f"{_shape(tensor)} holds {numel} elements, not a multiple of {known} "
                    f"(the product of {list(sizes)} without its -1)",)}  # fmt: skip
    if known == numel:
        return {}
    return {0: (f"{_shape(tensor)} holds {numel} elements; shape {list(sizes)} needs {known}",)}


def _channels(inputs: Any, weight: Any, groups: int) -> dict[int | str, tuple[str, ...]]:
    if not _tensors(inputs, weight) or inputs.dim() < 2 or weight.dim() < 2:
        return {}
    expected = int(weight.shape[1]) * groups
    if int(inputs.shape[1]) == expected:
        return {}
    return {0: (f"{inputs.shape[1]} channels (dim 1 of {_shape(inputs)}) ≠ the {expected} "
                f"that the weight {_shape(weight)} takes",)}  # fmt: skip


def _broadcast(
    first: tuple[int, torch.Tensor], y: torch.Tensor
) -> dict[int | str, tuple[str, ...]]:
    """Two operands of an elementwise op: the dims where neither size is 1 and they differ."""
    i, x = first
    found = []
    for back in range(1, min(x.dim(), y.dim()) + 1):
        p, q = int(x.shape[-back]), int(y.shape[-back])
        if p != q and 1 not in (p, q):
            found.append(f"dim {x.dim() - back} of {_shape(x)} is {p}, dim {y.dim() - back} of "
                         f"{_shape(y)} is {q}: neither is 1, so they do not broadcast")  # fmt: skip
    return {i: tuple(found)} if found else {}


def shape_diagnosis(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """What disagrees, in the terms of the call the user wrote (`name`: a public call's last
    part, F.linear's `linear`, or an aten op's name)."""
    if name == "linear":
        inputs = args[0] if args else kwargs.get("input")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        if _tensors(inputs, weight) and weight.dim() == 2 and inputs.dim() >= 1:
            return _linear(inputs, weight)
    if name in ("matmul", "mm", "addmm", "bmm") and len(args) >= 2:
        a, b = (args[1], args[2]) if name == "addmm" and len(args) > 2 else (args[0], args[1])
        if _tensors(a, b) and a.dim() >= 1 and b.dim() >= 1:
            inner = int(b.shape[-2] if b.dim() >= 2 else b.shape[0])
            if int(a.shape[-1]) != inner:
                return (f"A matrix product's inner dimensions disagree: the left operand "
                        f"{_shape(a)} ends in {a.shape[-1]}, the right one {_shape(b)} has "
                        f"{inner} rows. {GENERIC}")  # fmt: skip
    return GENERIC


def _linear(inputs: torch.Tensor, weight: torch.Tensor) -> str:
    features, last = int(weight.shape[1]), int(inputs.shape[-1])
    if last == features:
        return GENERIC
    text = (f"The linear layer's input {_shape(inputs)} ends in {last} features, but its weight "
            f"{_shape(weight)} takes {features} (in_features).")  # fmt: skip
    for start in range(1, inputs.dim() - 1):  # an unflattened batch: (N, C, H, W) into (N, C*H*W)
        tail = [int(s) for s in inputs.shape[start:]]
        if math.prod(tail) == features:
            product = " × ".join(map(str, tail))
            return (f"{text} Flattened from dim {start} ({product} = {features}) it would fit: "
                    f"the input was not flattened before the layer (`x.flatten({start})`).")  # fmt: skip
    return f"{text} {GENERIC}"
