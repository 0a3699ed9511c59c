"""Copy an op's arguments out of the process: specs for every tensor, values where they matter.

Values that explain a device-side assert are indices, targets and probabilities (one bad element
among thousands); weights only need their shape. Copies go to host memory before the op runs, so
they survive CUDA's sticky error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from reprocut.case import Captured, Generated, Symbol, arg_to_json
from reprocut.tensors import spec_of

# aten ops whose CUDA kernels can raise a device-side assert (bug-patterns.md §4).
ASSERTING_OPS = frozenset(
    {
        "aten::embedding",
        "aten::embedding_dense_backward",
        "aten::_embedding_bag",
        "aten::_embedding_bag_forward_only",
        "aten::embedding_bag",
        "aten::index",
        "aten::index_put_",
        "aten::_index_put_impl_",
        "aten::index_put",
        "aten::index_select",
        "aten::index_add_",
        "aten::index_add",
        "aten::index_copy_",
        "aten::index_fill_",
        "aten::index_reduce_",
        "aten::gather",
        "aten::scatter",
        "aten::scatter_",
        "aten::scatter_add",
        "aten::scatter_add_",
        "aten::scatter_reduce",
        "aten::scatter_reduce_",
        "aten::take",
        "aten::put_",
        "aten::nll_loss_forward",
        "aten::nll_loss2d_forward",
        "aten::nll_loss_backward",
        "aten::nll_loss2d_backward",
        "aten::binary_cross_entropy",
        "aten::multinomial",
        "aten::max_unpool2d",
        "aten::max_unpool3d",
        "aten::_assert_async",
        "aten::_ctc_loss",
    }
)

# ops whose floating-point inputs are the evidence (probabilities, BCE inputs)
FLOAT_EVIDENCE_OPS = frozenset(
    {"aten::multinomial", "aten::binary_cross_entropy", "aten::_assert_async"}
)

MAX_CAPTURED_ELEMENTS = 4_000_000  # per tensor; beyond this, keep the spec only
SMALL_FLOAT_ELEMENTS = 1 << 16  # floats this small are captured when the culprit is certain


@dataclass
class TensorStore:
    """Host copies of captured tensors, by key; saved as the run's inputs.pt."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    pinned: set[str] = field(default_factory=set)  # tracked here: is_pinned() asks CUDA
    counter: int = 0

    def add(self, tensor: torch.Tensor, *, non_blocking: bool = False) -> str:
        key = f"t{self.counter}"
        self.counter += 1
        self.tensors[key] = host_copy(tensor, non_blocking=non_blocking)
        if non_blocking and tensor.device.type != "cpu":
            self.pinned.add(key)
        return key

    def keep_only(self, keys: set[str]) -> None:
        self.tensors = {k: v for k, v in self.tensors.items() if k in keys}

    def save(self, path: Any) -> None:
        """Save plain host copies: pinned buffers are copied out without any CUDA call, so this
        works after a sticky CUDA error."""
        plain = {
            key: torch.empty(t.shape, dtype=t.dtype).copy_(t) if key in self.pinned else t
            for key, t in self.tensors.items()
        }
        torch.save(plain, path)


def host_copy(tensor: torch.Tensor, *, non_blocking: bool = False) -> torch.Tensor:
    """A contiguous host copy of the tensor's logical values (layout is kept in the spec).

    On CUDA with `non_blocking`, the copy goes to pinned memory and is queued on the stream: it
    completes before any later kernel runs, so it is intact even if the next kernel faults.
    """
    data = tensor.detach()
    if data.device.type == "cpu":
        return data.clone().contiguous()
    if non_blocking:
        buffer = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
        buffer.copy_(data, non_blocking=True)
        return buffer
    return data.to("cpu")


def wants_values(op: str, tensor: torch.Tensor, *, everything: bool) -> bool:
    """Should this argument's values be captured, or is its spec enough?"""
    if tensor.numel() > MAX_CAPTURED_ELEMENTS:
        return False
    if everything and tensor.numel() <= SMALL_FLOAT_ELEMENTS:
        return True
    if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        return True  # indices, targets, masks
    return op in FLOAT_EVIDENCE_OPS


def capture_arg(
    value: Any,
    op: str,
    store: TensorStore,
    *,
    everything: bool = False,
    non_blocking: bool = False,
) -> Any:
    """The JSON form (case.arg_to_json) of one argument, copying tensor values into `store`."""
    if isinstance(value, torch.Tensor):
        if wants_values(op, value, everything=everything):
            key = store.add(value, non_blocking=non_blocking)
            return arg_to_json(spec_of(value, Captured(key)))
        return arg_to_json(spec_of(value, _generator_for(value)))
    if isinstance(value, (list, tuple)):
        return {
            "list": [
                capture_arg(v, op, store, everything=everything, non_blocking=non_blocking)
                for v in value
            ]
        }
    if isinstance(value, torch.dtype):
        return arg_to_json(Symbol(str(value)))
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, (torch.memory_format, torch.layout)):
        return arg_to_json(Symbol(str(value)))
    if value is None or isinstance(value, (bool, int, float, str)):
        return arg_to_json(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    return {"unsupported": type(value).__name__}


def _generator_for(tensor: torch.Tensor) -> Generated:
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return Generated("randn")
    return Generated("zeros")


def capture_call(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    op: str,
    store: TensorStore,
    *,
    everything: bool = False,
    non_blocking: bool = False,
) -> dict[str, Any]:
    return {
        "args": [
            capture_arg(a, op, store, everything=everything, non_blocking=non_blocking)
            for a in args
        ],
        "kwargs": [
            [k, capture_arg(v, op, store, everything=everything, non_blocking=non_blocking)]
            for k, v in kwargs.items()
        ],
    }
