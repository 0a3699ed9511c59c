"""Copy an op's arguments out of the process: specs for every tensor, values where they matter.

Values that explain a device-side assert are indices, targets and probabilities (one bad element
among thousands); weights only need their shape. Copies go to host memory before the op runs, so
they survive CUDA's sticky error.

Capturing has two halves: `hold_call` copies values and reads layouts while the tensors exist;
`HeldCall.to_json` builds the JSON later. Snapshots of healthy steps are dropped unread, so the
recorder pays only for the first half on every asserting op. The same tensor often reaches
several asserting ops of a step unchanged (the target of `cross_entropy`, `nll_loss_forward` and
`nll_loss_backward`): queued copies are shared while the tensor is the same object at the same
version (`TensorStore.add`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from reprocut.model.case import Captured, Generated, Symbol, TensorSpec, arg_to_json
from reprocut.model.tensors import (
    SPARSE_LAYOUTS,
    layout_of,
    sparse_parts,
    spec_from_layout,
)
from reprocut.record.inside.host_ring import PinnedBuffers

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
    # queued copies of this step, by id(tensor): (weak reference, version, key); see add
    queued: dict[int, tuple[Any, int, str]] = field(default_factory=dict)
    buffers: PinnedBuffers = field(default_factory=PinnedBuffers)  # reused once dropped

    def add(self, tensor: torch.Tensor, *, non_blocking: bool = False) -> str:
        """A host copy of `tensor`'s values, by key. A queued copy (`non_blocking`, the
        snapshots' kind) is shared with the step's earlier queued copy of the same tensor object
        at the same version: no in-place op ran on it in between, so the values are the same.
        The step's end forgets them (`forget_queued`), so a key never spans two steps."""
        if non_blocking:
            earlier = self.queued.get(id(tensor))
            if (
                earlier is not None
                and earlier[0]() is tensor
                and earlier[1] == _version(tensor)
                and earlier[2] in self.tensors
            ):
                return earlier[2]
        key = f"t{self.counter}"
        self.counter += 1
        self.tensors[key] = host_copy(tensor, non_blocking=non_blocking, buffers=self.buffers)
        if non_blocking:
            if not tensor.is_cpu:
                self.pinned.add(key)
            version = _version(tensor)
            if version >= 0:
                self.queued[id(tensor)] = (weakref.ref(tensor), version, key)
        return key

    def forget_queued(self) -> None:
        """A step ended: its copies are not shared with the next one's (retiring a step drops
        its keys)."""
        if self.queued:
            self.queued = {}

    def keep_only(self, keys: set[str]) -> None:
        self.tensors = {k: v for k, v in self.tensors.items() if k in keys}

    def drop(self, keys: Iterable[str]) -> None:
        """Release copies nobody will read (a retired step's snapshots: their copies have
        completed): else the store, and pinned memory with it, grows with every step of a long
        run. Pinned buffers go back to `buffers` for the next steps' copies."""
        tensors, pinned = self.tensors, self.pinned
        for key in keys:
            tensor = tensors.pop(key, None)
            if key in pinned:
                pinned.discard(key)
                if tensor is not None:
                    self.buffers.give_back(tensor)

    def save(self, path: Any) -> None:
        """Save plain host copies: pinned buffers are copied out without any CUDA call, so this
        works after a sticky CUDA error."""
        plain = {
            key: torch.empty(t.shape, dtype=t.dtype).copy_(t) if key in self.pinned else t
            for key, t in self.tensors.items()
        }
        torch.save(plain, path)


def _version(tensor: torch.Tensor) -> int:
    """The tensor's version counter (bumped by every in-place op), or -1 where there is none
    (inference tensors): such copies are never shared."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


def host_copy(
    tensor: torch.Tensor, *, non_blocking: bool = False, buffers: PinnedBuffers | None = None
) -> torch.Tensor:
    """A contiguous host copy of the tensor's logical values (layout is kept in the spec).

    On CUDA with `non_blocking`, the copy goes to pinned memory (from `buffers` if given) and is
    queued on the stream: it completes before any later kernel runs, so it is intact even if
    the next kernel faults.
    """
    data = tensor.detach()
    if data.is_cpu:
        return data.clone().contiguous()
    if non_blocking:
        if buffers is None:
            buffer = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
        else:
            buffer = buffers.take(data.dtype, data.shape)
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


@dataclass(frozen=True, slots=True)
class HeldTensor:
    """A tensor argument as it was before its op ran: layout, and its host copy's key if its
    values were wanted. No reference to the tensor itself (it may be large, or on the GPU)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...] | None
    storage_offset: int
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    key: str | None
    # a sparse tensor: its layout name, its parts held, its COO coalesced flag
    sparse: tuple[str, tuple[HeldTensor, ...], bool | None] | None = None

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, key: str | None) -> HeldTensor:
        return cls(*layout_of(tensor), key)

    def to_spec(self) -> TensorSpec:
        values = None if self.key is None else Captured(self.key)
        spec = spec_from_layout(
            self.shape,
            self.stride,
            self.storage_offset,
            self.dtype,
            self.device,
            self.requires_grad,
            values,  # None: values generated by dtype, the shape is enough
        )
        if self.sparse is not None:
            layout, parts, coalesced = self.sparse
            spec = TensorSpec(
                shape=spec.shape,
                values=Generated("zeros"),  # unused: a sparse tensor's data are its parts
                dtype=spec.dtype,
                device=spec.device,
                requires_grad=spec.requires_grad,
                layout=layout,
                parts=tuple(part.to_spec() for part in parts),
                coalesced=coalesced,
            )
        return spec

    def to_json(self) -> dict[str, Any]:
        return arg_to_json(self.to_spec())


@dataclass(frozen=True, slots=True)
class HeldList:
    items: tuple[Any, ...]

    def to_json(self) -> dict[str, Any]:
        return {"list": [held_to_json(item) for item in self.items]}


def held_keys(value: Any) -> Iterator[str]:
    """The store keys of the host copies a held argument refers to."""
    if isinstance(value, HeldTensor):
        if value.key is not None:
            yield value.key
        for part in value.sparse[1] if value.sparse else ():
            yield from held_keys(part)
    elif isinstance(value, HeldList):
        for item in value.items:
            yield from held_keys(item)


@dataclass(frozen=True, slots=True)
class HeldCall:
    """A call's arguments, held (`hold_call`); `to_json` gives capture_call's JSON."""

    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    names: tuple[str, ...] | None = None  # the parameters' names, for the tensor table

    def to_json(self) -> dict[str, Any]:
        call: dict[str, Any] = {
            "args": [held_to_json(a) for a in self.args],
            "kwargs": [[k, held_to_json(v)] for k, v in self.kwargs],
        }
        if self.names is not None:
            call["names"] = list(self.names)
        return call

    def captured_keys(self) -> Iterator[str]:
        for value in (*self.args, *(v for _, v in self.kwargs)):
            yield from held_keys(value)


def held_to_json(value: Any) -> Any:
    if isinstance(value, (HeldTensor, HeldList)):
        return value.to_json()
    return value  # already JSON: scalars and symbols cost nothing to encode


def hold_arg(
    value: Any,
    op: str,
    store: TensorStore,
    *,
    everything: bool = False,
    non_blocking: bool = False,
) -> Any:
    """Copy a tensor argument's values into `store` if they matter, and read its layout."""
    kind = type(value)
    if kind in _AS_IS:  # most arguments: reductions, ignore_index, dims, None
        return value
    if kind is float:
        return {"float": repr(value)}
    if isinstance(value, torch.Tensor):
        if value.layout in SPARSE_LAYOUTS:  # its parts are dense: indices captured as such
            return _hold_sparse(value, op, store, everything=everything, non_blocking=non_blocking)
        key = None
        if wants_values(op, value, everything=everything):
            key = store.add(value, non_blocking=non_blocking)
        return HeldTensor.from_tensor(value, key)
    if isinstance(value, (list, tuple)):
        return HeldList(
            tuple(
                [
                    hold_arg(v, op, store, everything=everything, non_blocking=non_blocking)
                    for v in value
                ]
            )
        )
    return _scalar_json(value)


def _hold_sparse(
    tensor: torch.Tensor, op: str, store: TensorStore, *, everything: bool, non_blocking: bool
) -> HeldTensor:
    """A sparse COO or CSR tensor: its size and flags, and its parts held like dense tensors
    (integer indices captured, so out-of-range ids survive; values only where they matter)."""
    parts = tuple(
        hold_arg(part, op, store, everything=everything, non_blocking=non_blocking)
        for part in sparse_parts(tensor)
    )
    coalesced = tensor.is_coalesced() if tensor.layout == torch.sparse_coo else None
    layout = SPARSE_LAYOUTS[tensor.layout]
    return HeldTensor(*layout_of(tensor), None, sparse=(layout, parts, coalesced))


_AS_IS = frozenset({int, bool, str, type(None)})  # their JSON is themselves (arg_to_json)


def _scalar_json(value: Any) -> Any:
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


def hold_call(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    op: str,
    store: TensorStore,
    *,
    everything: bool = False,
    non_blocking: bool = False,
    names: tuple[str, ...] | None = None,
) -> HeldCall:
    """The first half of capturing a call: what must happen before the op runs (lists, not
    generators, inside: this runs for every asserting op of every step)."""
    return HeldCall(
        tuple(
            [hold_arg(a, op, store, everything=everything, non_blocking=non_blocking) for a in args]
        ),
        tuple(
            [
                (k, hold_arg(v, op, store, everything=everything, non_blocking=non_blocking))
                for k, v in kwargs.items()
            ]
        )
        if kwargs
        else (),
        names,
    )


def capture_call(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    op: str,
    store: TensorStore,
    *,
    everything: bool = False,
    non_blocking: bool = False,
    names: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    held = hold_call(
        args, kwargs, op, store, everything=everything, non_blocking=non_blocking, names=names
    )
    return held.to_json()
