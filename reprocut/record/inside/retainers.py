"""Who holds the memory, and what keeps a leak alive: walks from the user's variables.

Run at a failure or when memory carried across steps keeps growing (memory.py), never in the
normal record path: it makes a gc pass over every object. Live storages (memory.py's registry)
are sorted into roles (parameters and buffers, gradients, optimizer state, tensors saved for
backward, other live tensors) and by the line that made them. Storages made in an earlier step
(after the first) that are still alive are the leak; the user variable that reaches most of them
(a frame's local or the script's global, through lists, dicts, objects, and tensors' autograd
graphs down to the tensors their nodes saved) is named with the path, the way a heap analyser's
shortest path from a GC root reads.
"""

from __future__ import annotations

import ast
import collections
import gc
import linecache
import types
import warnings
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

import torch

from reprocut.record.inside.frames import UserFrames

_NODE_LIMIT = 200_000  # autograd nodes visited per variable
_OBJECT_LIMIT = 100_000  # container items visited per variable
_SKIPPED = (types.ModuleType, types.FunctionType, type, torch.nn.Module, torch.optim.Optimizer)


def _key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except Exception:
        return None


def _saved_names(node: Any, cache: dict[type, tuple[str, ...]]) -> tuple[str, ...]:
    names = cache.get(type(node))
    if names is None:
        names = cache[type(node)] = tuple(
            n for n in dir(node) if n.startswith("_saved_") and not n.endswith(("sizes", "strides"))
        )
    return names


class Graphs:
    """Autograd graphs walked once each: node -> the storages its subgraph saved."""

    def __init__(self) -> None:
        self.cache: dict[type, tuple[str, ...]] = {}
        # id -> node, the node kept: Python wrappers of C++ nodes are made on each access, and
        # an id freed with its wrapper can be reused by the next one, whose node a set of ids
        # would skip (the likely cause of the H200's short walks: 24 nodes of 16 validation
        # graphs, 3 of a two-layer attention; not reproduced with real nodes on CPU)
        self.seen: dict[int, Any] = {}
        self.unreadable = 0  # saved values that could not be read (freed by a backward pass)

    def saved_tensors(self, node: Any) -> Iterator[torch.Tensor]:
        """The tensors an autograd node saved for backward (none once its graph was freed)."""
        for name in _saved_names(node, self.cache):
            try:
                value = getattr(node, name)
            except Exception:
                self.unreadable += 1
                continue
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, (tuple, list)):
                yield from (v for v in value if isinstance(v, torch.Tensor))

    def walk(self, root: Any) -> Iterator[tuple[Any, torch.Tensor]]:
        """(node, saved tensor) for each node of `root`'s graph not walked before."""
        stack = [root]
        while stack and len(self.seen) < _NODE_LIMIT:
            node = stack.pop()
            if node is None or id(node) in self.seen:
                continue
            self.seen[id(node)] = node
            for tensor in self.saved_tensors(node):
                yield node, tensor
            stack.extend(n for n, _ in getattr(node, "next_functions", ()))


def roles(live: dict[int, Any]) -> tuple[dict[int, str], list[Any], dict[str, int]]:
    """Each live storage's role, every tensor the gc sees (for the walks), and what the walk
    of the autograd graphs saw (roots, nodes, saved values it could not read)."""
    role: dict[int, str] = {}
    tensors: list[Any] = []
    optimizers: list[Any] = []
    modules: list[Any] = []
    with warnings.catch_warnings():  # isinstance wakes lazy modules' deprecation warnings
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                tensors.append(obj)
            elif isinstance(obj, torch.nn.Module):
                modules.append(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                optimizers.append(obj)
    for module in modules:
        for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            role.setdefault(_key(tensor) or 0, "parameters")
            if tensor.grad is not None:
                role.setdefault(_key(tensor.grad) or 0, "gradients")
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                role.setdefault(_key(param) or 0, "parameters")
                if param.grad is not None:
                    role.setdefault(_key(param.grad) or 0, "gradients")
        for state in optimizer.state.values():
            for value in state.values() if isinstance(state, dict) else ():
                if isinstance(value, torch.Tensor):
                    role.setdefault(_key(value) or 0, "optimizer state")
    graphs, roots = Graphs(), 0
    for tensor in tensors:
        grad_fn = getattr(tensor, "grad_fn", None)
        if grad_fn is not None:
            roots += 1
            for _, saved in graphs.walk(grad_fn):
                role.setdefault(_key(saved) or 0, "saved for backward")
    walked = {"roots": roots, "nodes": len(graphs.seen), "unreadable": graphs.unreadable}
    # A forward output alive with no Python tensor on its storage is held from C++: by an
    # autograd graph. During a failed backward on a GPU the walk above reaches only the few
    # nodes before the failing one (3 of a two-layer attention's on the H200), so that is how
    # the saved activations are known there.
    visible = {_key(tensor) for tensor in tensors}
    inferred = {
        k for k, a in live.items() if k not in role and k not in visible and a.phase == "forward"
    }
    walked["inferred_saved"] = len(inferred)
    for key in inferred:
        role[key] = "saved for backward"
    return {k: role.get(k, "other live tensors") for k in live}, tensors, walked


def _group(live: dict[int, Any], keys: Any) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], int] = collections.Counter()
    for key in keys:
        a = live[key]
        groups[(a.line, a.module, a.op)] += a.nbytes
    return [
        {"line": line, "module": module, "op": op, "bytes": size}
        for (line, module, op), size in sorted(groups.items(), key=lambda kv: -kv[1])
    ]


def analyse(
    live: dict[int, Any],
    frames: UserFrames,
    frame: FrameType | None,
    tb: TracebackType | None,
    step: int,
) -> dict[str, Any]:
    """Roles and holders of the live storages; the leak's lines and the variable keeping it."""
    role, _, walked = roles(live)
    held: dict[str, int] = collections.Counter()
    for key, name in role.items():
        held[name] += live[key].nbytes
    persistent = {"parameters", "gradients", "optimizer state"}
    leaked = {k for k, a in live.items() if 1 <= a.step < step and role[k] not in persistent}
    result: dict[str, Any] = {
        "roles": dict(held),
        "top": _group(live, live)[:10],
        "leaked": _group(live, leaked)[:5],
        "leaked_bytes": sum(live[k].nbytes for k in leaked),
        "leaked_steps": len({live[k].step for k in leaked}),
        "graphs": walked,
    }
    if leaked:
        result["retainer"] = _best_retainer(live, leaked, _user_frames(frames, frame, tb))
    return result


def _user_frames(
    frames: UserFrames, frame: FrameType | None, tb: TracebackType | None
) -> list[FrameType]:
    found: list[FrameType] = []
    while tb is not None:
        found.append(tb.tb_frame)
        tb = tb.tb_next
    while frame is not None:
        found.append(frame)
        frame = frame.f_back
    return [f for f in found if frames.is_user(f.f_code)]


def _best_retainer(
    live: dict[int, Any], leaked: set[int], user_frames: list[FrameType]
) -> dict[str, Any] | None:
    best: dict[str, Any] | None = None
    seen_roots: set[int] = set()
    for frame in reversed(user_frames):  # outermost first: the longest-lived variables
        for name, value in list(frame.f_locals.items()):
            if name.startswith("__") or isinstance(value, _SKIPPED) or id(value) in seen_roots:
                continue
            seen_roots.add(id(value))
            found = _reach(value, live, leaked)
            if found and (best is None or found["bytes"] > best["bytes"]):
                best = {**found, "name": name, "file": frame.f_code.co_filename}
    if best is None:
        return None
    best["made_at"] = _assigned_at(best["file"], best["name"])
    best["kept_at"] = _stored_at(best["file"], best["name"])
    return best


def _reach(value: Any, live: dict[int, Any], leaked: set[int]) -> dict[str, Any] | None:
    """The leaked storages `value` reaches, and how: through containers, then tensors directly
    or through their autograd graphs' saved tensors (grouped by the node that saved them)."""
    graphs = Graphs()
    direct: set[int] = set()
    via: dict[int, str] = {}
    roots: collections.Counter[str] = collections.Counter()
    queue, seen, depth_of = collections.deque([(value, 0)]), {id(value)}, 0
    while queue and len(seen) < _OBJECT_LIMIT:
        item, depth = queue.popleft()
        depth_of = max(depth_of, depth)
        if isinstance(item, torch.Tensor):
            key = _key(item)
            if key in leaked:
                direct.add(key)
            grad_fn = item.grad_fn
            if grad_fn is not None:
                roots[type(grad_fn).__name__] += 1
                for node, saved in graphs.walk(grad_fn):
                    saved_key = _key(saved)
                    if saved_key in leaked and saved_key not in direct:
                        via.setdefault(saved_key, type(node).__name__)
            continue
        if depth >= 4 or isinstance(item, (str, bytes, int, float, bool)) or item is None:
            continue
        children: Any = ()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple, set, frozenset, collections.deque)):
            children = item
        elif hasattr(item, "__dict__") and not isinstance(item, _SKIPPED):
            children = vars(item).values()
        for child in list(children):
            if id(child) not in seen:
                seen.add(id(child))
                queue.append((child, depth + 1))
    keys = direct | set(via)
    if not keys:
        return None
    nodes = collections.Counter()
    for key, node in via.items():
        nodes[node] += live[key].nbytes
    biggest = max(keys, key=lambda k: live[k].nbytes)
    saver = max(nodes, key=nodes.__getitem__) if nodes else None
    saver_keys = [k for k, n in via.items() if n == saver]
    made = max(saver_keys or list(direct), key=lambda k: live[k].nbytes, default=biggest)
    return {
        "bytes": sum(live[k].nbytes for k in keys),
        "kind": type(value).__name__,
        "items": len(value)
        if hasattr(value, "__len__") and not isinstance(value, torch.Tensor)
        else None,
        "depth": depth_of,
        "graph": bool(via),
        "graph_root": roots.most_common(1)[0][0] if roots else None,
        "saver": saver,
        "saved_by_op": live[made].op,
        "saved_at": live[made].line,
    }


def _tree(filename: str) -> ast.AST | None:
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def _assigned_at(filename: str, name: str) -> list[Any] | None:
    """The first line that binds `name` in the file."""
    tree = _tree(filename)
    for node in ast.walk(tree) if tree is not None else ():
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
            isinstance(t, ast.Name) and t.id == name for t in targets
        ):
            return [filename, node.lineno]
    return None


def _stored_at(filename: str, name: str) -> list[Any] | None:
    """The first line that stores into the container `name`: name.append(...), name[k] = ...,
    name += ..."""
    tree = _tree(filename)
    for node in ast.walk(tree) if tree is not None else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "add", "insert", "update", "setdefault")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
        ) or (
            isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            return [filename, node.lineno]
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name
            for t in node.targets
        ):
            return [filename, node.lineno]
    return None
