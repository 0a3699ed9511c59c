"""fold_tensor_facts: `torch.randn((256, 256, 4096)).numel()` -> `268435456`.

Hoisting and dropping arguments leave values that a script computed from a tensor's shape
computed from a literal tensor made only for it: on the H200 a CuPy reduction kept
`n = torch.randn((256, 256, 4096)).numel()` (its `device=` dropped), a 1 GiB tensor drawn on
the CPU by every later check and by repro.py, to read one integer. Its shape is in the text:
the fact is folded into a literal. The size order counts such a fact as more than the literal
(`source.size`), so the fold is kept wherever the repro still fails (the tensor's random draw
is gone with it, which may change the values drawn after it: hence a check, not a rewrite).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import libcst as cst

from reprocut.source.passes.launches import integer
from reprocut.source.passes.specs import literal
from reprocut.source.passes.tree import (
    Options,
    PassContext,
    Targeted,
    dotted,
    is_constant,
    parse,
    transform,
)

# factories whose shape is their positional integers, or one tuple or list of them
_SHAPED = frozenset({"randn", "rand", "zeros", "ones", "empty"})
# methods that keep the shape of the tensor they are called on
_SAME_SHAPE = frozenset(
    {"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "int", "long", "bool",
     "contiguous", "clone", "detach", "requires_grad_"}
)  # fmt: skip
# methods whose first argument is the new shape
_NEW_SHAPE = frozenset({"as_strided", "view", "reshape", "expand"})


def _integers(node: cst.BaseExpression) -> tuple[int, ...] | None:
    """`(2, 3)`, `[2, 3]` -> (2, 3); None unless every element is a plain integer."""
    if not isinstance(node, cst.Tuple | cst.List):
        return None
    values = [_integer(element.value) for element in node.elements]
    return None if any(v is None for v in values) else tuple(v for v in values if v is not None)


def _integer(node: cst.BaseExpression) -> int | None:
    """An integer the text fixes (`4`, `-1`, `2 * 8`), as a kernel launch's grid is read."""
    return integer(node, {})


def _positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [arg.value for arg in call.args if arg.keyword is None and not arg.star]


def literal_shape(node: cst.BaseExpression) -> tuple[int, ...] | None:
    """The shape of a tensor built from literals, read from its text (None: not known)."""
    if not isinstance(node, cst.Call) or not is_constant(node):
        return None
    positional = _positional(node)
    path = dotted(node.func)
    if path is not None:
        name = path.removeprefix("torch.")
        if name in _SHAPED:
            if len(positional) == 1 and _integers(positional[0]) is not None:
                return _integers(positional[0])
            values = [_integer(v) for v in positional]
            return None if None in values else tuple(v for v in values if v is not None)
        if name in {"full", "empty_strided"} and positional:
            return _integers(positional[0])
        if name == "randint":
            sized = [arg.value for arg in node.args if arg.keyword and arg.keyword.value == "size"]
            shapes = [s for s in map(_integers, sized + positional) if s is not None]
            return shapes[0] if shapes else None
        return None
    if not isinstance(node.func, cst.Attribute):
        return None
    method, base = node.func.attr.value, node.func.value
    if method in _SAME_SHAPE:
        return literal_shape(base)
    if method in _NEW_SHAPE and positional:
        shape = _integers(positional[0])
        return shape if shape is not None and all(d >= 0 for d in shape) else None
    return None


def folded(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The literal a fact of a literal tensor comes to: `T.numel()`, `T.dim()`, `T.size(k)`,
    `T.shape[k]`, `T.ndim`, `len(T)`, and its whole shape `T.shape`, `T.size()` as a tuple
    (None: `node` is none of these)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method, args = node.func.attr.value, _positional(node)
        if method not in ("numel", "dim", "size") or len(args) != len(node.args):
            return None  # (the size order asks this of every expression: the name first)
        shape = literal_shape(node.func.value)
        if shape is None:
            return None
        if method == "numel" and not args:
            return cst.Integer(str(math.prod(shape)))
        if method == "dim" and not args:
            return cst.Integer(str(len(shape)))
        if method == "size" and len(args) == 1:
            return _dimension(shape, _integer(args[0]))
        if method == "size" and not args:
            return literal(shape)
        return None
    if isinstance(node, cst.Call) and dotted(node.func) == "len" and len(node.args) == 1:
        shape = literal_shape(node.args[0].value)
        return _dimension(shape, 0) if shape else None
    if isinstance(node, cst.Attribute) and node.attr.value in ("ndim", "shape"):
        shape = literal_shape(node.value)
        if shape is None:
            return None
        return cst.Integer(str(len(shape))) if node.attr.value == "ndim" else literal(shape)
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        value, index = node.value, node.slice[0].slice
        if not (isinstance(value, cst.Attribute) and value.attr.value == "shape"):
            return None
        if not isinstance(index, cst.Index):
            return None
        return _dimension(literal_shape(value.value), _integer(index.value))
    return None


def _dimension(shape: tuple[int, ...] | None, index: int | None) -> cst.BaseExpression | None:
    if shape is None or index is None or not -len(shape) <= index < len(shape):
        return None
    return cst.Integer(str(shape[index]))


class _Facts(cst.CSTVisitor):
    """The foldable facts, outermost first, in source order."""

    def __init__(self) -> None:
        self.found: list[tuple[cst.CSTNode, cst.BaseExpression]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        value = folded(node)
        if value is not None:
            self.found.append((node, value))
            return False
        return True


class _Fold(Targeted):
    def __init__(self, folds: dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.folds = folds

    def targets(self) -> Iterable[int]:
        return self.folds

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        return self.folds.get(id(original_node), updated_node)


def facts_of(module: cst.Module) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
    visitor = _Facts()
    module.visit(visitor)
    return visitor.found


def fold_tensor_facts(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Fold every fact of a literal tensor at once, then (rejected) one at a time."""
    while True:
        accepted = yield Options(_folds(code))
        if accepted is None:
            return
        _, code = accepted


def _folds(code: str) -> Iterator[tuple[int, str | None]]:
    module = parse(code)
    if module is None:
        return
    found = facts_of(module)
    if len(found) > 1:
        yield -1, transform(code, _Fold({id(n): v for n, v in found}), module)
    for i, (node, value) in enumerate(found):
        yield i, transform(code, _Fold({id(node): value}), module)
