"""Pinned host buffers and CUDA events, reused from step to step instead of made per step.

Each step of a `--nan` run copies its few norms to pinned memory behind an event, and each step
of a CUDA run records an event for its snapshots (recorder.py). A fresh pinned tensor goes
through the CachingHostAllocator (a lock, its own event bookkeeping) and a fresh Event costs a
create and a destroy: on a launch-bound loop that is measurable. A buffer or event comes back
here only once the step that used it has been read (its event reported completion), so the
next step's copy cannot overwrite values still unread.
"""

from __future__ import annotations

import torch

MAX_FREE = 4  # free buffers kept per (dtype, length), and events per device
MAX_SHAPES = 32  # distinct (dtype, length) keys kept before the free lists are dropped


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
    """One-dimensional pinned host tensors by dtype and length."""

    __slots__ = ("_free",)

    def __init__(self) -> None:
        self._free: dict[tuple[torch.dtype, int], list[torch.Tensor]] = {}

    def take(self, dtype: torch.dtype, length: int) -> torch.Tensor:
        free = self._free.get((dtype, length))
        if free:
            return free.pop()
        return torch.empty(length, dtype=dtype, pin_memory=True)

    def give_back(self, buffer: torch.Tensor) -> None:
        """`buffer` has been read: the copy into it completed and nobody holds its values."""
        key = (buffer.dtype, buffer.shape[0])
        free = self._free.get(key)
        if free is None:
            if len(self._free) >= MAX_SHAPES:  # lengths that keep changing: start over
                self._free.clear()
            free = self._free[key] = []
        if len(free) < MAX_FREE:
            free.append(buffer)
