"""The tensors an autograd graph keeps alive, read without running anything.

A node's saved tensors are read through `_raw_saved_<name>` (a SavedTensor) and its `.data`,
never through `_saved_<name>`: reading that one calls the saved-tensor hook's unpack, and under
non-reentrant activation checkpointing the unpack recomputes the whole checkpointed block,
once per read when no backward is running (on the H200 a block of 36 GiB attention scores, per
saved tensor). A hooked tensor's `.data` is what the pack hook kept: nothing for checkpoint
(its tensors are not held), a CPU copy for `save_on_cpu`. A custom `autograd.Function`'s node
is its ctx: `ctx.save_for_backward`'s tensors and those set as attributes (`ctx.x = x`), which
is where reentrant checkpointing keeps the block's inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from reprocut.model.budget import Deadline

NODE_LIMIT = 200_000  # nodes visited per walk
_CHECK_EVERY = 256  # nodes between two looks at the deadline


def _raw_names(node: Any, cache: dict[type, tuple[str, ...]]) -> tuple[str, ...]:
    names = cache.get(type(node))
    if names is None:
        names = cache[type(node)] = tuple(n for n in dir(node) if n.startswith("_raw_saved_"))
    return names


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item


class Graphs:
    """Autograd graphs walked once each: node -> the tensors its subgraph saved."""

    def __init__(self, deadline: Deadline | None = None) -> None:
        self.cache: dict[type, tuple[str, ...]] = {}
        # id -> node, the node kept: Python wrappers of C++ nodes are made on each access, and
        # an id freed with its wrapper can be reused by the next one, whose node a set of ids
        # would skip (the likely cause of the H200's short walks: 24 nodes of 16 validation
        # graphs, 3 of a two-layer attention; not reproduced with real nodes on CPU)
        self.seen: dict[int, Any] = {}
        self.unreadable = 0  # saved values that could not be read
        self.packed = 0  # saved values a saved-tensor hook packed (activation checkpointing)
        self.deadline = deadline
        self.stopped = False  # the deadline came before the walk's end

    def _saved(self, saved: Any) -> Iterator[torch.Tensor]:
        """What one SavedTensor holds, without unpacking it (see the module's docstring)."""
        try:
            hooked = saved.unpack_hook is not None
            data = saved.data
        except Exception:
            self.unreadable += 1
            return
        if hooked:
            self.packed += 1
        yield from _tensors_in(data)

    def saved_tensors(self, node: Any) -> Iterator[torch.Tensor]:
        """The tensors an autograd node keeps for backward (none once its graph was freed)."""
        for name in _raw_names(node, self.cache):
            try:
                value = getattr(node, name)
            except Exception:
                self.unreadable += 1
                continue
            for saved in value if isinstance(value, (tuple, list)) else (value,):
                if saved is not None:
                    yield from self._saved(saved)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            for value in getattr(node, "__dict__", {}).values():  # ctx.x = tensor
                yield from _tensors_in(value)

    def walk(self, root: Any) -> Iterator[tuple[Any, torch.Tensor]]:
        """(node, saved tensor) for each node of `root`'s graph not walked before."""
        stack = [root]
        seen, deadline = self.seen, self.deadline
        while stack and len(seen) < NODE_LIMIT:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            if deadline is not None and len(seen) % _CHECK_EVERY == 0 and deadline.expired():
                self.stopped = True
                return
            for tensor in self.saved_tensors(node):
                yield node, tensor
            stack.extend(n for n, _ in getattr(node, "next_functions", ()))

    def summary(self) -> dict[str, int]:
        return {"nodes": len(self.seen), "unreadable": self.unreadable, "packed": self.packed}
