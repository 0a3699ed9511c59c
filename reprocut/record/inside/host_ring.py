"""Pinned host buffers and CUDA events, reused from step to step instead of made per step.

Each step of a CUDA run copies its asserting ops' evidence to pinned memory (capture.py) and
records an event after its kernels (recorder.py); with `--nan` it also copies its few norms to
pinned memory behind an event (nonfinite.py). A fresh pinned tensor goes through the
CachingHostAllocator (a lock, its own event bookkeeping, a free that waits for events) and a
fresh Event costs a create and a destroy: on a launch-bound loop that is measurable. A buffer or
event comes back here only once the step that used it is known complete and read, so the next
step's copy cannot overwrite values still unread.
"""

from __future__ import annotations

import torch

MAX_FREE = 4  # free buffers kept per (dtype, shape), and events per device
MAX_SHAPES = 32  # distinct (dtype, shape) keys kept before the free lists are dropped
MAX_POOLED_BYTES = 256 << 10  # a larger buffer goes back to the allocator: the pool stays small


class EventPool:
    """CUDA events by device, handed out again once their step was seen complete."""

    __slots__ = ("_free",)

    def __init__(self) -> None:
        self._free: dict[int, list[torch.cuda.Event]] = {}

    def take(self, device: int) -> torch.cuda.Event:
        free = self._free.get(device)
        return free.pop() if free else torch.cuda.Event()

    def give_back(self, device: int, event: torch.cuda.Event) -> None:
        """`event` has completed (query() said so): it may be recorded again."""
        free = self._free.setdefault(device, [])
        if len(free) < MAX_FREE:
            free.append(event)


class PinnedBuffers:
    """Contiguous pinned host tensors by dtype and shape."""

    __slots__ = ("_free",)

    def __init__(self) -> None:
        self._free: dict[tuple[torch.dtype, tuple[int, ...]], list[torch.Tensor]] = {}

    def take(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A pinned tensor of that dtype and shape; its values are stale: copy into it."""
        free = self._free.get((dtype, shape))
        if free:
            return free.pop()
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def give_back(self, buffer: torch.Tensor) -> None:
        """`buffer` (from `take`) is done with: the copy into it completed and nobody will
        read it again."""
        if buffer.nbytes > MAX_POOLED_BYTES:
            return
        key = (buffer.dtype, buffer.shape)
        free = self._free.get(key)
        if free is None:
            if len(self._free) >= MAX_SHAPES:  # lengths that keep changing: start over
                self._free.clear()
            free = self._free[key] = []
        if len(free) < MAX_FREE:
            free.append(buffer)
