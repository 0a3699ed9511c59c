"""Who holds the memory, and what keeps it alive: walks from the user's variables.

Run at a failure or when memory carried across steps keeps growing (memory.py), never in the
normal record path: it makes a gc pass over every object. Live storages (memory.py's registry)
are sorted into roles (parameters and buffers, gradients, optimizer state, tensors saved for
backward, recomputed for backward, backward temporaries, other live tensors) and by the line
that made them. Storages made in an earlier step (after the first) that are still alive are the
leak; the user variable that reaches most of them (a frame's local or the script's global,
through lists, dicts, objects, and tensors' autograd graphs down to the tensors their nodes
saved: autograd_graph.py) is named with the path, the way a heap analyser's shortest path from
a GC root reads. At a failure, the variable that reaches most of the step's saved activations
is named too (a loss summed over micro-batches keeps every one's graph). Every walk stops at
its Deadline and says so: the report goes out with what was found.
"""

from __future__ import annotations

import ast
import collections
import gc
import linecache
import types
import warnings
from types import FrameType
from typing import Any

import torch

from reprocut.model.budget import Deadline
from reprocut.record.inside.autograd_graph import Graphs
from reprocut.record.inside.frame_locals import local_values
from reprocut.record.inside.frames import UserFrames

_OBJECT_LIMIT = 100_000  # container items visited per variable
_SKIPPED = (types.ModuleType, types.FunctionType, type, torch.nn.Module, torch.optim.Optimizer)
_PERSISTENT = frozenset({"parameters", "gradients", "optimizer state"})
_SAVED = frozenset({"saved for backward", "recomputed for backward"})


def _key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage()._cdata
    except Exception:
        return None


def roles(
    live: dict[int, Any], deadline: Deadline | None = None
) -> tuple[dict[int, str], list[Any], dict[str, Any]]:
    """Each live storage's role, every tensor the gc sees (for the walks), and what the walk
    of the autograd graphs saw (roots, nodes, saved values it could not read or that a hook
    packed, whether it stopped at the deadline)."""
    role: dict[int, str] = {}
    tensors: list[Any] = []
    optimizers: list[Any] = []
    modules: list[Any] = []
    nodes: list[Any] = []  # custom Functions' nodes Python holds (a checkpoint's input saver)
    with warnings.catch_warnings():  # isinstance wakes lazy modules' deprecation warnings
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                tensors.append(obj)
            elif isinstance(obj, torch.nn.Module):
                modules.append(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                optimizers.append(obj)
            elif isinstance(obj, torch._C._FunctionBase):
                nodes.append(obj)
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
    graphs, roots = Graphs(deadline), 0
    for root in (*(getattr(t, "grad_fn", None) for t in tensors), *nodes):
        if root is not None:
            roots += 1
            for _, saved in graphs.walk(root):
                role.setdefault(_key(saved) or 0, "saved for backward")
            if graphs.stopped:
                break
    walked: dict[str, Any] = {"roots": roots, **graphs.summary(), "stopped": graphs.stopped}
    # A forward output alive with no Python tensor on its storage is held from C++: by an
    # autograd graph. During a failed backward on a GPU the walk above reaches only the few
    # nodes before the failing one (3 of a two-layer attention's on the H200), so that is how
    # the saved activations are known there. What backward made and no role claims is in
    # flight inside the engine (gradients not yet summed into a .grad).
    visible = {_key(tensor) for tensor in tensors}
    inferred = 0
    for key, made in live.items():
        found = role.get(key)
        if made.phase == "recompute" and found in (None, "saved for backward"):
            role[key] = "recomputed for backward"  # checkpointing made it again, for backward
        elif found is None and key not in visible and made.phase == "forward":
            role[key], inferred = "saved for backward", inferred + 1
        elif found is None and made.phase == "backward":
            role[key] = "backward temporaries"
    walked["inferred_saved"] = inferred
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
    stack: list[FrameType],
    step: int,
    deadline: Deadline,
    *,
    at_failure: bool = False,
) -> dict[str, Any]:
    """Roles and holders of the live storages; the leak's lines and the variable keeping it;
    at a failure, the variable keeping most of the step's saved activations. `stack`: the
    frames to look for the user's variables in, innermost first."""
    role, _, walked = roles(live, deadline)
    held: dict[str, int] = collections.Counter()
    for key, name in role.items():
        held[name] += live[key].nbytes
    leaked = {k for k, a in live.items() if 1 <= a.step < step and role[k] not in _PERSISTENT}
    result: dict[str, Any] = {
        "roles": dict(held),
        "top": _group(live, live)[:10],
        "leaked": _group(live, leaked)[:5],
        "leaked_bytes": sum(live[k].nbytes for k in leaked),
        "leaked_steps": len({live[k].step for k in leaked}),
        "graphs": walked,
        "skipped": [],
    }
    if walked["stopped"]:
        result["skipped"].append(_stopped("the walk of the autograd graphs", walked, deadline))
    user = [f for f in stack if frames.is_user(f.f_code)]
    if leaked:
        result["retainer"] = _best_retainer(live, leaked, user, deadline)
    holding = {k for k, a in live.items() if a.step == step and role[k] in _SAVED}
    if at_failure and holding:
        result["holder"] = _best_retainer(live, holding, user, deadline)
    if deadline.expired() and (leaked or (at_failure and holding)):
        result["skipped"].append(
            {"stage": "the search for the variable that keeps the memory",
             "reason": f"stopped at its {deadline.seconds:g} s budget; what it found is kept"}
        )  # fmt: skip
    return result


def _stopped(stage: str, walked: dict[str, Any], deadline: Deadline) -> dict[str, str]:
    return {
        "stage": stage,
        "reason": f"stopped at its {deadline.seconds:g} s budget after {walked['nodes']} nodes; "
        "roles of what it did not reach are inferred",
    }


def _best_retainer(
    live: dict[int, Any], keys: set[int], user_frames: list[FrameType], deadline: Deadline
) -> dict[str, Any] | None:
    best: dict[str, Any] | None = None
    seen_roots: set[int] = set()
    for frame in reversed(user_frames):  # outermost first: the longest-lived variables
        for name, value in list(local_values(frame).items()):
            if deadline.expired():
                break
            if name.startswith("__") or isinstance(value, _SKIPPED) or id(value) in seen_roots:
                continue
            seen_roots.add(id(value))
            found = _reach(value, live, keys, deadline)
            if found and (best is None or found["bytes"] > best["bytes"]):
                code = frame.f_code
                best = {**found, "name": name, "file": code.co_filename,
                        "scope": (code.co_firstlineno, code.co_name)}  # fmt: skip
    if best is None:
        return None
    scope = best.pop("scope")
    best["made_at"] = _assigned_at(best["file"], best["name"], scope)
    best["kept_at"] = _stored_at(best["file"], best["name"], scope)
    return best


def _reach(
    value: Any, live: dict[int, Any], keys: set[int], deadline: Deadline
) -> dict[str, Any] | None:
    """The storages of `keys` that `value` reaches, and how: through containers, then tensors
    directly or through their autograd graphs' saved tensors (grouped by the node that saved
    them)."""
    graphs = Graphs(deadline)
    direct: set[int] = set()
    via: dict[int, str] = {}
    roots: collections.Counter[str] = collections.Counter()
    queue, seen, depth_of = collections.deque([(value, 0)]), {id(value)}, 0
    while queue and len(seen) < _OBJECT_LIMIT and not graphs.stopped:
        item, depth = queue.popleft()
        depth_of = max(depth_of, depth)
        if isinstance(item, torch.Tensor):
            key = _key(item)
            if key in keys:
                direct.add(key)
            grad_fn = item.grad_fn
            if grad_fn is not None:
                roots[type(grad_fn).__name__] += 1
                for node, saved in graphs.walk(grad_fn):
                    saved_key = _key(saved)
                    if saved_key in keys and saved_key not in direct:
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
    found = direct | set(via)
    if not found:
        return None
    nodes: collections.Counter[str] = collections.Counter()
    for key, node in via.items():
        nodes[node] += live[key].nbytes
    biggest = max(found, key=lambda k: live[k].nbytes)
    saver = max(nodes, key=nodes.__getitem__) if nodes else None
    saver_keys = [k for k, n in via.items() if n == saver]
    made = max(saver_keys or list(direct), key=lambda k: live[k].nbytes, default=biggest)
    return {
        "bytes": sum(live[k].nbytes for k in found),
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


def _tree(filename: str, scope: tuple[int, str] | None = None) -> ast.AST | None:
    """The file's syntax tree; with `scope` (a code object's first line and name), the
    function it is, where the variable lives (the module for `<module>`)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None
    if scope is None or scope[1] == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == scope[1]:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if first == scope[0]:
                return node
    return tree


def _assigned_at(
    filename: str, name: str, scope: tuple[int, str] | None = None
) -> list[Any] | None:
    """The first line that binds `name` in its function (in the file, without `scope`)."""
    tree = _tree(filename, scope)
    for node in ast.walk(tree) if tree is not None else ():
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
            isinstance(t, ast.Name) and t.id == name for t in targets
        ):
            return [filename, node.lineno]
    return None


def _stored_at(filename: str, name: str, scope: tuple[int, str] | None = None) -> list[Any] | None:
    """The first line that stores into the container `name` or adds to it: name.append(...),
    name[k] = ..., name += ..., name = name + ..."""
    tree = _tree(filename, scope)
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
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.BinOp)
            and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.value))
        ):
            return [filename, node.lineno]
    return None
