"""What the hooks read off an op's call on the hot path: layouts, devices, and CUDA's errors.

Every op of a recorded step has its arguments' layouts taken (spec_tuple), so these are a few
C getters each, and the objects they return are kept as they are until a step is written
(trace.py). The dispatch mode (ops.py), the function mode (calls.py) and the public calls found
on the stack (public.py) share them.
"""

from __future__ import annotations

from typing import Any

import torch

from reprocut.model.signature import is_cuda_failure
from reprocut.record.inside.capture import HeldList, HeldTensor


def is_cuda_error(exc: BaseException) -> bool:
    return is_cuda_failure(type(exc).__name__, str(exc), getattr(exc, "error_code", None))


def on_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """No tensor argument (or tensor in a list argument) is on another device than the CPU
    (`is_cpu`: a getter; `.device.type` builds a device object)."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            if not value.is_cpu:
                return False
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor) and not item.is_cpu:
                    return False
    return True


_Tensor = torch.Tensor
_STRIDED = torch.strided


def spec_tuple(value: Any) -> Any:
    """A tensor's layout as cheap, hashable objects; made JSON-ready only when written.

    Runs for every argument of every op: a few C getters, and the device object as it is
    (`.device.type` alone costs more than the other getters together)."""
    if isinstance(value, _Tensor):
        if value.layout is not _STRIDED:
            return (value.shape, value.dtype, None, 0, value.device)
        return (value.shape, value.dtype, value.stride(), value.storage_offset(), value.device)
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], _Tensor):
        return tuple(map(spec_tuple, value))
    return None


def held_spec(value: Any) -> Any:
    """spec_tuple of an argument as `hold_arg` held it: the same tuple, from the layout read
    then (a snapshot's tensors have been read once; their getters are not asked again)."""
    kind = type(value)
    if kind is HeldTensor:
        return (value.shape, value.dtype, value.stride, value.storage_offset, value.device)
    if kind is HeldList and value.items and type(value.items[0]) is HeldTensor:
        return tuple(map(held_spec, value.items))
    return None
