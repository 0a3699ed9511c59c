"""Walking a libcst tree fast: the reducer's checks read every candidate's tree several times.

libcst's `node.children`, its visitors and `matchers.findall` build each node's child list
through the node's own visit machinery; before a candidate is run, the validity rules, the
focus check and the size order walked its tree six or seven times that way, and on CPU that
took longer than running the candidate (0.07 s a candidate against 0.04 s a check). A node's
children are its dataclass fields that hold nodes, so reading the fields, in the order libcst
visits them (learnt once per kind of node), gives the same nodes in the same order at a fraction
of the cost; and the nodes of a whole module are listed once per module (parse() shares one
tree per text).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from functools import cache
from typing import TypeVar

import libcst as cst

Node = TypeVar("Node", bound=cst.CSTNode)


@cache
def _fields(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


def _holds_nodes(value: object) -> bool:
    return isinstance(value, cst.CSTNode) or (
        isinstance(value, tuple | list) and bool(value) and isinstance(value[0], cst.CSTNode)
    )


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


def child_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node`'s children, as `node.children` lists them, from its fields."""
    kind = type(node)
    present = tuple(name for name in _fields(kind) if _holds_nodes(getattr(node, name)))
    order = _ORDERS.get((kind, present))
    if order is None:
        order = _ORDERS[(kind, present)] = _visit_order(node, present)
    found: list[cst.CSTNode] = []
    for name in order:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            found.append(value)
        else:
            found.extend(item for item in value if isinstance(item, cst.CSTNode))
    return found


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


# (module, its nodes) by id: a module is kept alive by its entry, so an id is never reused
_MODULE_NODES: dict[int, tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = {}
_KEEP = 64


def all_nodes(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    """Every node of `node`'s tree (a module's listed once while it is among the latest)."""
    if not isinstance(node, cst.Module):
        return tuple(walk(node))
    entry = _MODULE_NODES.get(id(node))
    if entry is not None and entry[0] is node:
        return entry[1]
    found = tuple(walk(node))
    if len(_MODULE_NODES) >= _KEEP:
        with contextlib.suppress(RuntimeError, StopIteration, KeyError):  # another thread's
            del _MODULE_NODES[next(iter(_MODULE_NODES))]
    _MODULE_NODES[id(node)] = (node, found)
    return found


def of_type(node: cst.CSTNode, kind: type[Node]) -> list[Node]:
    """The nodes of `kind` in `node`'s tree, in source order (`matchers.findall(node,
    m.Kind())`, without the matcher machinery)."""
    return [n for n in all_nodes(node) if isinstance(n, kind)]
