"""Walking a libcst tree fast: the reducer's checks read every candidate's tree several times.

libcst's `node.children`, its visitors and `matchers.findall` build each node's child list
through the node's own visit machinery; before a candidate is run, the validity rules, the
focus check and the size order walked its tree six or seven times that way, and on CPU that
took longer than running the candidate (0.07 s a candidate against 0.04 s a check). A node's
children are its dataclass fields that hold nodes, so reading the fields, in the order libcst
visits them (learnt once per kind of node), gives the same nodes in the same order at a fraction
of the cost. Each node's children are read once (the rules walk a candidate's tree a dozen
times), and a module's nodes, its nodes of each kind asked and its parent map once per module
(parse() shares one tree per text). Node kinds are told by type where it can be:
`isinstance` against libcst's abstract classes goes through ABCMeta, slowly when it fails.
On the H200's script reductions, replayed here, making and judging candidates took a third of
the time it had (benchmarks/bench_reducer_work.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from typing import TypeVar

import libcst as cst

Node = TypeVar("Node", bound=cst.CSTNode)


@cache
def _fields(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


# whether a type is a kind of node, by type: `isinstance(x, cst.CSTNode)` goes through ABCMeta
# (CSTNode is an ABC), and the walks below ask it for every field of every node
_NODE_KINDS: dict[type, bool] = {}


def _is_node(value: object) -> bool:
    kind = type(value)
    known = _NODE_KINDS.get(kind)
    if known is None:
        known = _NODE_KINDS[kind] = issubclass(kind, cst.CSTNode)
    return known


def _holds_nodes(value: object) -> bool:
    kind = type(value)
    if kind is tuple or kind is list:
        return bool(value) and _is_node(value[0])  # type: ignore[index]
    return _is_node(value)


# the order libcst visits a kind's fields in (decorators before `def`, `(` before the value),
# by kind and by which of its fields hold nodes: read once from one such node's `children`
_ORDERS: dict[tuple[type, tuple[str, ...]], tuple[str, ...]] = {}


def _visit_order(node: cst.CSTNode, present: tuple[str, ...]) -> tuple[str, ...]:
    position = {id(child): k for k, child in enumerate(node.children)}

    def first(name: str) -> int:
        value = getattr(node, name)
        items = value if isinstance(value, tuple | list) else (value,)
        return min((position.get(id(item), len(position)) for item in items), default=0)

    return tuple(sorted(present, key=first))


# (node, its children) by the node's id, the node kept alive by its entry: a candidate's tree is
# walked by a dozen rules, each from its top; emptied whole past _KEEP_CHILDREN entries
_CHILDREN: dict[int, tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = {}
_KEEP_CHILDREN = 100_000


def child_nodes(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    """`node`'s children, as `node.children` lists them, from its fields (once per node)."""
    entry = _CHILDREN.get(id(node))
    if entry is not None and entry[0] is node:
        return entry[1]
    if len(_CHILDREN) >= _KEEP_CHILDREN:
        _CHILDREN.clear()
    children = _read_children(node)
    _CHILDREN[id(node)] = (node, children)
    return children


def _read_children(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    kind = type(node)
    present = tuple(name for name in _fields(kind) if _holds_nodes(getattr(node, name)))
    order = _ORDERS.get((kind, present))
    if order is None:
        order = _ORDERS[(kind, present)] = _visit_order(node, present)
    found: list[cst.CSTNode] = []
    for name in order:
        value = getattr(node, name)
        if _is_node(value):
            found.append(value)
        else:
            found.extend(item for item in value if _is_node(item))
    return tuple(found)


def walk(
    node: cst.CSTNode, prune: Callable[[cst.CSTNode], bool] | None = None
) -> Iterator[cst.CSTNode]:
    """`node` and every node below it, depth first; below a node `prune` is true of, nothing."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if prune is not None and prune(current):
            continue
        stack.extend(reversed(child_nodes(current)))


# (module, its nodes, its nodes by kind asked, its nodes' parents once asked) by id: a module is
# kept alive by its entry, so an id is never reused
_Entry = tuple[
    cst.CSTNode, tuple[cst.CSTNode, ...], dict[type, list[cst.CSTNode]], dict[int, cst.CSTNode]
]
_MODULE_NODES: dict[int, _Entry] = {}
_KEEP = 64


def _module_entry(module: cst.Module) -> _Entry:
    entry = _MODULE_NODES.get(id(module))
    if entry is not None and entry[0] is module:
        return entry
    entry = (module, tuple(walk(module)), {}, {})
    if len(_MODULE_NODES) >= _KEEP:
        with contextlib.suppress(RuntimeError, StopIteration, KeyError):  # another thread's
            del _MODULE_NODES[next(iter(_MODULE_NODES))]
    _MODULE_NODES[id(module)] = entry
    return entry


def all_nodes(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    """Every node of `node`'s tree (a module's listed once while it is among the latest)."""
    if not isinstance(node, cst.Module):
        return tuple(walk(node))
    return _module_entry(node)[1]


def of_type(node: cst.CSTNode, kind: type[Node]) -> list[Node]:
    """The nodes of `kind` in `node`'s tree, in source order (`matchers.findall(node,
    m.Kind())`, without the matcher machinery); a module's, once per kind. Shared: read only."""
    if not isinstance(node, cst.Module):
        return [n for n in walk(node) if isinstance(n, kind)]
    _, nodes, by_kind, _ = _module_entry(node)
    found = by_kind.get(kind)
    if found is None:  # by exact type: isinstance against libcst's ABCs is slow when it fails
        matching = {t for t in set(map(type, nodes)) if issubclass(t, kind)}
        found = by_kind[kind] = [n for n in nodes if type(n) in matching]
    return found  # type: ignore[return-value]


def paths_to(module: cst.Module, targets: Iterable[int]) -> frozenset[int]:
    """The ids of the nodes `targets` (ids) of `module` and of every node above them: where a
    transformer that changes only those nodes need go."""
    _, nodes, _, parents = _module_entry(module)
    if not parents:  # filled at once (one update), so another thread sees it empty or whole
        found = {id(child): node for node in nodes for child in child_nodes(node)}
        parents.update(found)
    path: set[int] = set()
    for target in targets:
        if target not in parents and target != id(module):
            continue  # not in this module
        at: int | None = target
        while at is not None and at not in path:
            path.add(at)
            parent = parents.get(at)
            at = None if parent is None else id(parent)
    return frozenset(path)
