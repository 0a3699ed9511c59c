"""The shared machinery of the source passes: parsing, statement indexing, replacement, the
pass protocol and the failing call ("focus") they must keep.

A pass is a generator: given the best code so far it yields candidate texts, and the reducer
sends back whether each was accepted (`accepted = yield candidate`). After an acceptance the pass
continues from the accepted text, so a sweep survives the best changing mid-pass. A pass may
instead yield `Options`: the candidates it would try next, in order, were each one before
rejected (a lazy sequence of (tag, candidate) pairs); the reducer may then run several at once,
and sends back the first accepted pair, or None. Either way the pass sees the answers a
one-at-a-time run would give it. A pass never judges a candidate itself: the reducer's sort key
and signature check do that. Code that libcst cannot parse or rebuild (`ParserSyntaxError`,
`CSTValidationError`) means "cannot apply".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as m

from reprocut.model.case import TensorSpec
from reprocut.source.passes.walk import child_nodes, paths_to


@dataclass(frozen=True, slots=True)
class Options:
    """What a pass would try next, in order, each assuming the ones before it were rejected:
    (tag, candidate) pairs, made lazily (a candidate may be None: cannot apply). The pass gets
    back the first accepted pair, or None when none was."""

    items: Iterable[tuple[Any, str | None]]


SourcePass = Callable[[str, "PassContext"], Generator[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class PassContext:
    """What passes may know beyond the code: where sibling modules live, recorded tensors."""

    search_dirs: tuple[Path, ...] = ()  # the script's directory and cwd: sibling modules
    # tensors that reached the failing call, by argument position (None: not a tensor)...
    specs: tuple[TensorSpec | None, ...] = ()
    # ...and the tensor parameters of the function that makes it, by name
    named_specs: tuple[tuple[str, TensorSpec], ...] = ()
    # ...and its plain parameters (numbers, strings, tuples of them) with their values
    named_values: tuple[tuple[str, Any], ...] = ()
    # the failing call's own plain values: each positional argument's (None: not a number or a
    # tuple of numbers), its keywords', and the grid of a `kernel[grid](...)` launch
    call_args: tuple[Any, ...] = ()
    call_keywords: tuple[tuple[str, Any], ...] = ()
    call_grid: Any = None
    focus: str | None = None  # the failing source line's text (its call is tried first)
    # the failure is a memory fault: what reaches the failing call is not swapped for `0`
    memory_fault: bool = False
    # candidates checked side by side: a search over an integer cuts its gap this many ways
    ways: int = 2


STATEMENT = (
    m.SimpleStatementLine()
    | m.If()
    | m.For()
    | m.While()
    | m.With()
    | m.Try()
    | m.FunctionDef()
    | m.ClassDef()
)
COMPOUND = (cst.If, cst.For, cst.While, cst.With, cst.Try, cst.FunctionDef, cst.ClassDef)
STATEMENT_TYPES = (cst.SimpleStatementLine, *COMPOUND)  # what STATEMENT matches, for isinstance
PASS_LINE = cst.SimpleStatementLine(body=[cst.Pass()])
DOCSTRING = m.SimpleStatementLine([m.Expr(m.SimpleString() | m.ConcatenatedString())])
TENSOR_FACTORIES = frozenset(
    {"randn", "rand", "zeros", "ones", "full", "randint", "arange", "empty", "empty_strided",
     "tensor"}
)  # fmt: skip


# --- helpers ---------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def parse(code: str) -> cst.Module | None:
    """The module of `code` (None: not Python). Cached: a pass parses the same text many times
    over, and libcst trees are immutable, so one tree per text is safe to share."""
    try:
        return cst.parse_module(code)
    except (cst.ParserSyntaxError, RecursionError):
        return None


class Targeted(cst.CSTTransformer):
    """A transformer that changes only nodes it knows by identity (`targets`), and the nodes
    above them: `transform` lets it descend only the paths to those. libcst's visit otherwise
    rebuilds every node of the module, and a pass makes a candidate this way per site (on
    the H200's reductions, most of the time spent making candidates)."""

    path: frozenset[int] | None = None  # the ids it may visit (None: every node)

    def targets(self) -> Iterable[int]:
        raise NotImplementedError

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.path is not None and id(node) not in self.path:
            return False
        return super().on_visit(node)


def visited(module: cst.Module, transformer: cst.CSTTransformer) -> cst.Module:
    """`module.visit(transformer)`, a Targeted one let down only the paths to its nodes."""
    if isinstance(transformer, Targeted):
        transformer.path = paths_to(module, transformer.targets())
    return module.visit(transformer)


def transform(
    code: str, transformer: cst.CSTTransformer, module: cst.Module | None = None
) -> str | None:
    """The code after `transformer`, or None when it cannot apply (invalid tree, bad syntax).

    Pass `module` (the parse of `code`) when the transformer matches nodes by identity.
    """
    module = parse(code) if module is None else module
    if module is None:
        return None
    try:
        new = visited(module, transformer).code
    except (cst.CSTValidationError, ValueError, TypeError):
        return None
    if new == code or parse(new) is None or not compiles(new):
        return None
    return new


def compiles(code: str) -> bool:
    """Does Python accept the candidate (libcst builds some trees Python rejects)?"""
    try:
        compile(code, "<candidate>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def sweep(
    code: str, count: Callable[[str], int], apply_at: Callable[[str, int], str | None]
) -> Generator[Any, Any, str]:
    """Try `apply_at(code, i)` for every site i, from the last to the first; returns the code
    as it stands after the sweep.

    Going backwards keeps the indices of sites not yet tried stable when one is removed.
    """
    i = count(code) - 1
    while i >= 0:
        fixed = code
        accepted = yield Options((j, apply_at(fixed, j)) for j in range(i, -1, -1))
        if accepted is None:
            return code
        j, code = accepted
        i = min(j - 1, count(code) - 1)
    return code


def body_statements(suite: cst.BaseSuite) -> list[cst.BaseStatement]:
    """The statements of a block, as statements that can stand in any other block."""
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    assert isinstance(suite, cst.SimpleStatementSuite)
    return [cst.SimpleStatementLine(body=suite.body)]


def dotted(node: cst.BaseExpression) -> str | None:
    """`torch.nn.functional` for an attribute chain of names, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def alias_name(alias: cst.ImportAlias, *, first: bool) -> str:
    """The name an import binds: `import a.b as c` binds c, `import a.b` binds a (`first`),
    `from m import x` binds x (the name as written)."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    written = cst.Module([]).code_for_node(alias.name)
    return written.split(".")[0] if first else written


def is_constant(node: cst.CSTNode) -> bool:
    """A literal, or a tensor built from literals (`torch.randn(4, 8).as_strided(...)`).

    Such an expression is an atom for the size order: it stands for data, not for program.
    """
    if isinstance(node, cst.Integer | cst.Float | cst.Imaginary | cst.SimpleString):
        return True
    if isinstance(node, cst.Name):
        return node.value in {"True", "False", "None"}
    if isinstance(node, cst.UnaryOperation):
        return is_constant(node.expression)
    if isinstance(node, cst.Tuple | cst.List):
        return all(is_constant(element.value) for element in node.elements)
    if isinstance(node, cst.Attribute):
        path = dotted(node)
        return path is not None and path.startswith("torch.") and path.count(".") == 1
    if isinstance(node, cst.Call):
        if not all(is_constant(arg.value) for arg in node.args):
            return False
        func = node.func
        path = dotted(func)
        if path is not None:
            return path.startswith("torch.") and path.split(".")[-1] in TENSOR_FACTORIES
        return isinstance(func, cst.Attribute) and is_constant(func.value)
    return False


class _NameCounter(cst.CSTVisitor):
    def __init__(self, variables_only: bool) -> None:
        self.counts: dict[str, int] = {}
        self.variables_only = variables_only

    def visit_Name(self, node: cst.Name) -> None:
        self.counts[node.value] = self.counts.get(node.value, 0) + 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if not self.variables_only:
            return True
        node.value.visit(self)  # `x.std`: `x` is a variable, `std` is not
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        if not self.variables_only:
            return True
        node.value.visit(self)  # `f(std=1)`: the keyword is not a variable
        return False


def name_counts(node: cst.CSTNode) -> dict[str, int]:
    """Every Name node, attribute and keyword names included."""
    counter = _NameCounter(variables_only=False)
    node.visit(counter)
    return counter.counts


def variable_counts(node: cst.CSTNode) -> dict[str, int]:
    """Names used as variables, with counts (attribute and keyword names left out)."""
    counter = _NameCounter(variables_only=True)
    node.visit(counter)
    return counter.counts


class RenameVariables(cst.CSTTransformer):
    """Replace variables by expressions (attribute names and keyword names stay)."""

    def __init__(self, names: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.names = names

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> Any:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> Any:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Any:
        return self.names.get(original_node.value, updated_node)


def _statements_in_blocks(module: cst.Module) -> list[cst.BaseStatement]:
    """Post-order list of statements that sit in a block (elif branches are not), as a libcst
    visitor would list them, from the fields walk.child_nodes reads (no statement sits in an
    expression: those are not entered)."""
    found: list[cst.BaseStatement] = []
    elifs: set[int] = set()
    stack: list[tuple[cst.CSTNode, bool]] = [(module, False)]
    while stack:
        node, left = stack.pop()
        kind = type(node)
        if left:
            if _is_statement(kind) and id(node) not in elifs:
                found.append(node)  # type: ignore[arg-type]
            continue
        if _is_expression(kind):
            continue
        if kind is cst.If and type(node.orelse) is cst.If:  # type: ignore[attr-defined]
            elifs.add(id(node.orelse))  # type: ignore[attr-defined]
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(child_nodes(node)))
    return found


@cache
def _is_statement(kind: type) -> bool:
    return issubclass(kind, STATEMENT_TYPES)


@cache
def _is_expression(kind: type) -> bool:
    return issubclass(kind, cst.BaseExpression)


_STATEMENTS: OrderedDict[int, tuple[cst.Module, tuple[cst.BaseStatement, ...]]] = OrderedDict()


def statements_of(module: cst.Module) -> list[cst.BaseStatement]:
    """The module's statements in post-order (cached per tree, as `parse` caches trees)."""
    cached = _STATEMENTS.get(id(module))
    if cached is None or cached[0] is not module:
        cached = (module, tuple(_statements_in_blocks(module)))
        _STATEMENTS[id(module)] = cached
        if len(_STATEMENTS) > 256:
            _STATEMENTS.popitem(last=False)
    return list(cached[1])


class _ReplaceStatements(Targeted):
    """Replace statements (by identity) with lists of statements; empty blocks get `pass`."""

    def __init__(self, replacements: dict[int, Sequence[cst.BaseStatement]]) -> None:
        super().__init__()
        self.replacements = replacements

    def targets(self) -> Iterable[int]:
        return self.replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        new = self.replacements.get(id(original_node))
        if new is not None:
            if not new:
                return cst.RemoveFromParent()
            return cst.FlattenSentinel(list(new))
        return updated_node

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> Any:
        new = self.on_leave(original_node, updated_node)
        if isinstance(new, cst.IndentedBlock) and not new.body:
            return new.with_changes(body=[PASS_LINE])
        return new


def replace_statements(
    code: str, replacements: dict[int, Sequence[cst.BaseStatement]]
) -> str | None:
    module = parse(code)
    if module is None:
        return None
    return replace_in(code, module, replacements)


def replace_in(
    code: str, module: cst.Module, replacements: dict[int, Sequence[cst.BaseStatement]]
) -> str | None:
    try:
        new = visited(module, _ReplaceStatements(replacements)).code
    except (cst.CSTValidationError, ValueError, TypeError):
        return None
    return None if new == code or not compiles(new) else new


def statement_site(
    code: str, index: int, rewrite: Callable[[cst.Module, cst.BaseStatement], Any]
) -> str | None:
    """Apply `rewrite(module, statement)` (-> list of statements or None) to statement `index`."""
    module = parse(code)
    if module is None:
        return None
    statements = statements_of(module)
    if index >= len(statements):
        return None
    new = rewrite(module, statements[index])
    if new is None:
        return None
    return replace_in(code, module, {id(statements[index]): new})


def count_statements(code: str) -> int:
    module = parse(code)
    return 0 if module is None else len(statements_of(module))


class Enclosing(cst.CSTVisitor):
    """The innermost function around a node (the module when there is none)."""

    def __init__(self, target: cst.CSTNode) -> None:
        self.target = target
        self.stack: list[cst.CSTNode] = []
        self.found: cst.CSTNode | None = None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.target and self.found is None:
            self.found = self.stack[-1] if self.stack else None
        return super().on_visit(node)


def candidates(source_pass: SourcePass, code: str, context: PassContext) -> Iterator[str]:
    """Every candidate a pass makes from `code`, none accepted (for tests and inspection)."""
    generator = source_pass(code, context)
    try:
        step = next(generator)
        while True:
            if isinstance(step, Options):
                yield from (candidate for _, candidate in step.items if candidate is not None)
                step = generator.send(None)
            else:
                yield step
                step = generator.send(False)
    except StopIteration:
        return
