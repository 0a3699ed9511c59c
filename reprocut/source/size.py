"""The size order: which of two scripts is simpler, and the counts a result reports.

Every acceptance of the source reducer asks one question, "is this candidate strictly smaller
than the best?", so the order that answers it is one total order (`sort_key`) kept apart from
the loop that applies it: passes and tests read it alone, and the reported line and statement
counts measure a script the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import libcst as cst

from reprocut.source.passes import (
    COMPOUND,
    folded,
    integer_value,
    is_constant,
    parse,
    sibling_imports,
    without_seed,
)
from reprocut.source.passes.walk import walk


@dataclass
class _Measure:
    """Counts for the size order. A tensor built from literals counts as one node."""

    compound: int = 0
    small: int = 0
    nodes: int = 0
    names: int = 0
    integers: int = 0

    @classmethod
    def of(cls, module: cst.Module) -> _Measure:
        measure = cls()
        for node in walk(module, prune=_literal_tensor):
            measure.count(node)
        return measure

    def count(self, node: cst.CSTNode) -> None:
        kind = _kind_of(type(node))
        if kind & _COMPOUND:
            self.compound += 1
        elif kind & _SMALL:
            self.small += 1
        if kind & _EXPRESSION:
            # a fact of a literal tensor (`torch.randn(4, 8).numel()`, `.size()`) is the tensor
            # and a computation: more than the literal it folds to (passes.tensor_facts)
            literal = folded(node) if kind & _FOLDABLE else None
            self.nodes += 1 if literal is None else 1 + _expressions(literal)
        if kind & _NAME:
            self.names += 1
        elif kind & _INTEGER:
            self.integers += integer_value(node)  # type: ignore[arg-type]


# what the measure counts a node as, by its type (every node of every candidate is counted:
# an isinstance against libcst's abstract classes is slow when it fails)
_COMPOUND, _SMALL, _EXPRESSION, _FOLDABLE, _NAME, _INTEGER = (1 << k for k in range(6))


@cache
def _kind_of(node_type: type) -> int:
    flags = (
        (COMPOUND, _COMPOUND),
        ((cst.BaseSmallStatement,), _SMALL),
        ((cst.BaseExpression, cst.Arg), _EXPRESSION),
        ((cst.Call, cst.Attribute, cst.Subscript), _FOLDABLE),  # what `folded` may fold
        ((cst.Name,), _NAME),
        ((cst.Integer,), _INTEGER),
    )
    kind = 0
    for types, flag in flags:
        if issubclass(node_type, types):
            kind |= flag
    return kind


def _expressions(node: cst.CSTNode) -> int:
    return sum(1 for part in walk(node) if isinstance(part, cst.BaseExpression))


def _literal_tensor(node: cst.CSTNode) -> bool:
    """A call building a tensor from literals: one node, its insides uncounted."""
    return type(node) is cst.Call and is_constant(node)


def sort_key(code: str, search_dirs: Sequence[Path] = ()) -> tuple[int, ...]:
    """Smaller is simpler: imports of the user's own modules (a repro is one file), then
    blocks (loops, branches, functions: a flat script is simpler), non-blank lines, statements,
    expression nodes, variable names, the sum of integer constants, characters. A top-level
    `torch.manual_seed(...)` counts for nothing: random tensors must draw the same values in
    every run (reprocut.source.passes.specs.seeded)."""
    module = parse(code)
    if module is None:
        return (sys.maxsize,)
    unseeded = without_seed(module)
    lines, length = count_lines(code), len(code)
    if unseeded is not module:  # the seed's lines, less (a module's code is its statements')
        kept = {id(statement) for statement in unseeded.body}
        seed = "".join(module.code_for_node(s) for s in module.body if id(s) not in kept)
        lines, length = lines - count_lines(seed), length - len(seed)
        module = unseeded
    measure = _Measure.of(module)
    return (
        len(sibling_imports(module, search_dirs)) if search_dirs else 0,
        measure.compound,
        lines,
        measure.small,
        measure.nodes,
        measure.names,
        measure.integers,
        length,
    )


def count_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def count_small_statements(code: str) -> int:
    module = parse(code)
    if module is None:
        return 0
    measure = _Measure.of(module)
    return measure.small + measure.compound
