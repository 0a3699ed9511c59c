"""Statement-level passes: delete (ddmin), unwrap blocks, drop unused definitions and comments,
inline names bound to literals."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from typing import Any

import libcst as cst
import libcst.matchers as m

from reprocut.source.passes.tree import (
    DOCSTRING,
    Options,
    PassContext,
    RenameVariables,
    body_statements,
    count_statements,
    name_counts,
    parse,
    replace_in,
    statement_site,
    statements_of,
    sweep,
    transform,
    variable_counts,
)
from reprocut.source.passes.walk import of_type

# --- delete_statements -----------------------------------------------------------------------


def delete_statements(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """ddmin over statements by post-order index: big chunks first, from the end backwards."""
    n = count_statements(code)
    size = max(n // 2, 1)
    while size >= 1:
        start = count_statements(code) - size
        while start > -size:
            fixed = code
            starts = range(start, -size, -size)
            accepted = yield Options((s, _without_chunk(fixed, s, size)) for s in starts)
            if accepted is None:
                break
            start, code = accepted
            start = min(start, count_statements(code)) - size
        if size == 1:
            break
        size //= 2


def _without_chunk(code: str, start: int, size: int) -> str | None:
    """The code without the statements start..start+size-1 (post-order), if that is valid."""
    module = parse(code)
    if module is None:
        return None
    chunk = statements_of(module)[max(start, 0) : start + size]
    return replace_in(code, module, {id(s): [] for s in chunk}) if chunk else None


# --- unwrap_blocks ---------------------------------------------------------------------------


class _LoopExits(cst.CSTVisitor):
    """Does a loop body break or continue at its own level?"""

    def __init__(self) -> None:
        self.found = False

    def visit_Break(self, node: cst.Break) -> None:
        self.found = True

    def visit_Continue(self, node: cst.Continue) -> None:
        self.found = True

    def visit_For(self, node: cst.For) -> bool:
        return False

    def visit_While(self, node: cst.While) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False


def _exits_loop(body: cst.BaseSuite) -> bool:
    visitor = _LoopExits()
    for statement in body_statements(body):
        statement.visit(visitor)
    return visitor.found


def _call(path: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.parse_expression(path), args=[cst.Arg(a) for a in args])


def block_alternatives(statement: cst.BaseStatement) -> list[list[cst.BaseStatement]]:
    """What a compound statement may be replaced by, most drastic first."""
    if isinstance(statement, cst.For) and statement.asynchronous is None:
        if _exits_loop(statement.body):
            return []
        first = cst.Assign(
            targets=[cst.AssignTarget(statement.target)],
            value=_call("next", _call("iter", statement.iter)),
        )
        return [[cst.SimpleStatementLine(body=[first]), *body_statements(statement.body)]]
    if isinstance(statement, cst.While):
        return [] if _exits_loop(statement.body) else [body_statements(statement.body)]
    if isinstance(statement, cst.If):
        options = [body_statements(statement.body)]
        if isinstance(statement.orelse, cst.Else):
            options.append(body_statements(statement.orelse.body))
        elif isinstance(statement.orelse, cst.If):
            options.append([statement.orelse])
        return options
    if isinstance(statement, cst.With) and statement.asynchronous is None:
        bound = [
            cst.SimpleStatementLine(
                body=[cst.Assign([cst.AssignTarget(item.asname.name)], item.item)]
            )
            for item in statement.items
            if item.asname is not None
        ]
        return [[*bound, *body_statements(statement.body)]]
    if isinstance(statement, cst.Try):
        return [body_statements(statement.body)]
    return []


def unwrap_blocks(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Replace a block by its contents: a loop by one iteration, an `if` by a branch, a `with`
    or `try` by its body."""
    i = count_statements(code) - 1
    while i >= 0:
        accepted = yield Options(_unwrappings(code, i))
        if accepted is None:
            return
        i, code = accepted
        i = min(i, count_statements(code) - 1)  # the unwrapped body may hold more blocks


def _unwrappings(code: str, last: int) -> Iterator[tuple[int, str | None]]:
    """Each block's alternatives, from statement `last` back to the first."""
    module = parse(code)
    if module is None:
        return
    statements = statements_of(module)
    for i in range(min(last, len(statements) - 1), -1, -1):
        for option in block_alternatives(statements[i]):
            yield i, replace_in(code, module, {id(statements[i]): option})


# --- remove_unused_definitions ---------------------------------------------------------------


def _bound_names(statement: cst.BaseStatement) -> list[str] | None:
    """Names a definition statement binds, or None when it is not a plain definition."""
    if isinstance(statement, cst.FunctionDef | cst.ClassDef):
        return [statement.name.value]
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Import):
        names = []
        for alias in small.names:
            bound = alias.asname.name if alias.asname is not None else alias.name
            while isinstance(bound, cst.Attribute):
                bound = bound.value
            if not isinstance(bound, cst.Name):
                return None
            names.append(bound.value)
        return names
    if isinstance(small, cst.ImportFrom):
        if isinstance(small.names, cst.ImportStar) or m.matches(small.module, m.Name("__future__")):
            return None
        return [
            (a.asname.name if a.asname is not None else a.name).value  # type: ignore[union-attr]
            for a in small.names
        ]
    if isinstance(small, cst.Assign | cst.AnnAssign):
        targets = (
            [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        )
        flat = [e.value for t in targets if isinstance(t, cst.Tuple | cst.List) for e in t.elements]
        names = [t for t in targets if not isinstance(t, cst.Tuple | cst.List)] + flat
        if all(isinstance(t, cst.Name) for t in names):  # `x = ...`, `B, T, D = ...`
            return [t.value for t in names]  # type: ignore[attr-defined]
    return None


def unused_definitions(module: cst.Module) -> list[cst.BaseStatement]:
    """Definitions none of whose names are mentioned anywhere outside the definition itself;
    not the `forward` of an `autograd.Function` or `nn.Module`, which `apply` and a call run
    without naming it (on the CPU segment_pool case, every round's removal of it raised
    NotImplementedError)."""
    totals = name_counts(module)
    called = _called_by_torch(module)
    unused = []
    for statement in statements_of(module):
        names = _bound_names(statement)
        if not names or id(statement) in called:
            continue
        inside = name_counts(statement)
        if all(totals.get(n, 0) - inside.get(n, 0) == 0 for n in names):
            unused.append(statement)
    return unused


# base classes whose `forward` torch runs for the user (`Fn.apply(...)`, `module(x)`)
_FORWARD_BASES = ("Function", "Module")


def _called_by_torch(module: cst.Module) -> set[int]:
    """The `forward` methods of the module's autograd Functions and nn.Modules, by id."""
    found = set()
    for node in of_type(module, cst.ClassDef):
        bases = [module.code_for_node(b.value) for b in node.bases]
        if not any(b.rsplit(".", 1)[-1] in _FORWARD_BASES for b in bases):
            continue
        for statement in body_statements(node.body):
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "forward":
                found.add(id(statement))
    return found


def _without_unused(code: str) -> str | None:
    """The code less every import, function, class and assignment nothing refers to."""
    module = parse(code)
    unused = [] if module is None else unused_definitions(module)
    if module is None or not unused:
        return None
    return replace_in(code, module, {id(s): [] for s in unused})


def remove_all_unused(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Everything nothing refers to, in one candidate: run early, one check spares
    delete_statements its search for them (the constants a jump to the failing call leaves,
    the buffer a recorded spec replaced in the call)."""
    candidate = _without_unused(code)
    if candidate is not None:
        yield candidate


def remove_unused_definitions(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Drop imports, functions, classes and assignments nothing refers to: all, then one by one."""
    candidate = _without_unused(code)
    if candidate is not None and (yield candidate):
        code = candidate
    tried: set[str] = set()
    while True:
        module = parse(code)
        if module is None:
            return
        pending = [s for s in unused_definitions(module) if module.code_for_node(s) not in tried]
        if not pending:
            return
        statement = pending[-1]
        tried.add(module.code_for_node(statement))
        candidate = replace_in(code, module, {id(statement): []})
        if candidate is not None and (yield candidate):
            code = candidate


# --- inline_names ----------------------------------------------------------------------------


def _single_assignment(statement: cst.BaseStatement) -> cst.Assign | None:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    return small if isinstance(small, cst.Assign) and len(small.targets) == 1 else None


def _split_tuple_assignment(
    module: cst.Module, statement: cst.BaseStatement
) -> list[cst.BaseStatement] | None:
    """`mean, std = a, b` with `std` unused elsewhere -> `mean = a`."""
    assign = _single_assignment(statement)
    if assign is None:
        return None
    target, value = assign.targets[0].target, assign.value
    if not (isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple)):
        return None
    if len(target.elements) != len(value.elements):
        return None
    if not all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements
    ):
        return None
    if any(isinstance(e, cst.StarredElement) for e in value.elements):
        return None
    names = [e.value.value for e in target.elements]  # type: ignore[attr-defined]
    if set(names) & set(variable_counts(value)):
        return None  # `a, b = b, a` is not two assignments
    totals, inside = variable_counts(module), variable_counts(statement)
    kept = [
        (n, e.value)
        for n, e in zip(names, value.elements, strict=True)
        if totals.get(n, 0) > inside.get(n, 0)
    ]
    if len(kept) == len(names):
        return None  # every part is used: splitting alone makes nothing smaller
    return [
        cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(n))], value=v)])
        for n, v in kept
    ]


def _is_literal(node: cst.BaseExpression) -> bool:
    """A number, a one-line string, True/False/None: short enough to stand where it is used
    (a kernel's multi-line source stays a named constant)."""
    if isinstance(node, cst.Integer | cst.Float):
        return True
    if isinstance(node, cst.SimpleString):
        return "\n" not in node.value
    if isinstance(node, cst.UnaryOperation):
        return _is_literal(node.expression)
    return isinstance(node, cst.Name) and node.value in {"True", "False", "None"}


def _is_alias(module: cst.Module, value: cst.BaseExpression) -> bool:
    """A name the module binds once (an assignment, not a parameter or import elsewhere)."""
    return isinstance(value, cst.Name) and _bindings(module, value.value) == 1


class _BindingCounter(cst.CSTVisitor):
    """How many places bind a name: assignments, loop targets, parameters, `as` names."""

    def __init__(self, name: str) -> None:
        self.name, self.count = name, 0

    def _add(self, target: cst.CSTNode | None) -> None:
        if target is not None and self.name in name_counts(target):
            self.count += 1

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._add(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._add(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._add(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._add(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self._add(node.name)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._add(node.name)


def _bindings(module: cst.Module, name: str) -> int:
    counter = _BindingCounter(name)
    module.visit(counter)
    return counter.count


def _inline_literal(module: cst.Module, statement: cst.BaseStatement) -> str | None:
    """`threads = 0` bound once at module level: its uses become `0` and the line goes. So
    does `mean = x`, `x` bound once too: its uses become `x`, the very same object."""
    assign = _single_assignment(statement)
    if assign is None or statement not in module.body:
        return None
    target = assign.targets[0].target
    if not (
        isinstance(target, cst.Name)
        and (_is_literal(assign.value) or _is_alias(module, assign.value))
    ):
        return None
    name = target.value
    bindings = _bindings(module, name)
    if bindings != 1 or name_counts(module).get(name, 0) < 2:
        return None
    rest = module.with_changes(body=[s for s in module.body if s is not statement])
    try:
        return rest.visit(RenameVariables({name: assign.value})).code
    except Exception:  # libcst refuses the tree: cannot apply
        return None


def inline_names(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Drop the unused parts of tuple assignments, then put literals in place of the names
    bound to them once."""
    code = yield from sweep(
        code, count_statements, lambda c, i: statement_site(c, i, _split_tuple_assignment)
    )

    def inline_at(code: str, i: int) -> str | None:
        module = parse(code)
        if module is None:
            return None
        statements = statements_of(module)
        return _inline_literal(module, statements[i]) if i < len(statements) else None

    yield from sweep(code, count_statements, inline_at)


# --- strip_comments --------------------------------------------------------------------------


class _StripComments(cst.CSTTransformer):
    """Drops comments, and docstrings where a statement is left to hold the body."""

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> Any:
        return updated_node.with_changes(body=_without_docstring(updated_node.body))

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> Any:
        return updated_node.with_changes(body=_without_docstring(updated_node.body))

    def leave_EmptyLine(self, original_node: cst.EmptyLine, updated_node: cst.EmptyLine) -> Any:
        return cst.RemoveFromParent() if updated_node.comment is not None else updated_node

    def leave_TrailingWhitespace(
        self, original_node: cst.TrailingWhitespace, updated_node: cst.TrailingWhitespace
    ) -> Any:
        return updated_node.with_changes(comment=None, whitespace=cst.SimpleWhitespace(""))


def _without_docstring(body: Sequence[Any]) -> Sequence[Any]:
    """`body` less a leading string statement, unless that is all it holds."""
    if len(body) < 2 or not m.matches(body[0], DOCSTRING):
        return body
    rest = list(body[1:])
    rest[0] = rest[0].with_changes(leading_lines=body[0].leading_lines)
    return rest


def strip_comments(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Remove comments and docstrings: in a repro they describe code that is no longer there."""
    candidate = transform(code, _StripComments())
    if candidate is not None:
        yield candidate
