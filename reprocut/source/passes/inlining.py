"""Inlining passes: paste the user's sibling modules, run a function's body in place of its call."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as m

from reprocut.source.passes.tree import (
    DOCSTRING,
    PASS_LINE,
    PassContext,
    RenameVariables,
    body_statements,
    count_statements,
    dotted,
    name_counts,
    parse,
    replace_in,
    statements_of,
    sweep,
    transform,
)

# --- inline_sibling_imports ------------------------------------------------------------------


def sibling_file(module_name: str, search_dirs: Sequence[Path]) -> Path | None:
    """The user's own module file that `import module_name` would load, if there is one."""
    parts = module_name.split(".")
    for directory in search_dirs:
        for candidate in (
            directory.joinpath(*parts).with_suffix(".py"),
            directory.joinpath(*parts, "__init__.py"),
        ):
            if candidate.is_file():
                return candidate
    return None


def import_module_name(statement: cst.BaseSmallStatement) -> str | None:
    if isinstance(statement, cst.ImportFrom):
        if statement.relative or statement.module is None:
            return None
        return dotted(statement.module)
    if isinstance(statement, cst.Import) and len(statement.names) == 1:
        return dotted(statement.names[0].name)
    return None


def sibling_imports(
    module: cst.Module, search_dirs: Sequence[Path]
) -> list[cst.SimpleStatementLine]:
    """Import lines (a single import each) that load one of the user's own modules."""
    found = []
    for statement in statements_of(module):
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            name = import_module_name(statement.body[0])
            if name is not None and sibling_file(name, search_dirs) is not None:
                found.append(statement)
    return found


MAIN_GUARD = m.If(
    test=m.Comparison(
        left=m.Name("__name__"),
        comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=m.SimpleString())],
    )
)
FUTURE_IMPORT = m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])


class _UnqualifyModule(cst.CSTTransformer):
    """`helpers.f` -> `f` once the module `helpers` is pasted in."""

    def __init__(self, alias: str) -> None:
        super().__init__()
        self.alias = alias

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> Any:
        if m.matches(updated_node.value, m.Name(self.alias)):
            return updated_node.attr
        return updated_node


_IMPORT = m.SimpleStatementLine([m.Import() | m.ImportFrom()])


def _sibling_body(path: Path, into: cst.Module) -> list[cst.BaseStatement] | None:
    """The sibling's statements to paste into `into`: less its docstring (mid-module it would
    be a stray string), its main guard, and the imports `into` already makes."""
    try:
        module = cst.parse_module(path.read_text())
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return None
    present = {into.code_for_node(s).strip() for s in into.body if m.matches(s, _IMPORT)}
    body = list(
        module.body[1:] if module.body and m.matches(module.body[0], DOCSTRING) else module.body
    )
    return [
        s
        for s in body
        if not m.matches(s, MAIN_GUARD)
        and not m.matches(s, FUTURE_IMPORT)
        and not (m.matches(s, _IMPORT) and module.code_for_node(s).strip() in present)
    ]


def inline_all(code: str, search_dirs: Sequence[Path]) -> str:
    """`code` with every sibling module it imports pasted in (unchecked: a pass's lookahead)."""
    tried: set[str] = set()
    while True:
        module = parse(code)
        if module is None:
            return code
        pending = [
            s for s in sibling_imports(module, search_dirs) if module.code_for_node(s) not in tried
        ]
        if not pending:
            return code
        tried.add(module.code_for_node(pending[0]))
        code = _inline_import(code, module, pending[0], search_dirs) or code


def inline_sibling_imports(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Paste a sibling module the script imports in place of its import line."""
    tried: set[str] = set()
    while True:
        module = parse(code)
        if module is None:
            return
        pending = [
            s
            for s in sibling_imports(module, context.search_dirs)
            if module.code_for_node(s) not in tried
        ]
        if not pending:
            return
        line = pending[0]
        tried.add(module.code_for_node(line))
        candidate = _inline_import(code, module, line, context.search_dirs)
        if candidate is not None and (yield candidate):
            code = candidate


def _inline_import(
    code: str, module: cst.Module, line: cst.SimpleStatementLine, search_dirs: Sequence[Path]
) -> str | None:
    statement = line.body[0]
    name = import_module_name(statement)
    assert name is not None
    path = sibling_file(name, search_dirs)
    body = None if path is None else _sibling_body(path, module)
    if body is None:
        return None
    if isinstance(statement, cst.ImportFrom):
        aliases = [] if isinstance(statement.names, cst.ImportStar) else statement.names
        for alias in aliases:
            if alias.asname is not None:
                target = alias.asname.name
                assert isinstance(target, cst.Name)
                source = alias.name
                body.append(
                    cst.SimpleStatementLine(body=[cst.Assign([cst.AssignTarget(target)], source)])
                )
        return replace_in(code, module, {id(line): body})
    assert isinstance(statement, cst.Import)
    alias = statement.names[0]
    if isinstance(alias.name, cst.Attribute) and alias.asname is None:
        return None  # `import pkg.mod` binds `pkg`: its attribute chains are left alone
    bound = alias.asname.name if alias.asname is not None else alias.name
    assert isinstance(bound, cst.Name)
    pasted = replace_in(code, module, {id(line): body})
    if pasted is None:
        return None
    return transform(pasted, _UnqualifyModule(bound.value)) or pasted


# --- inline_calls ----------------------------------------------------------------------------


class _Facts(cst.CSTVisitor):
    """What forbids inlining a function body: yields, scope declarations, early returns."""

    def __init__(self) -> None:
        self.returns = 0
        self.blocked = False

    def visit_Yield(self, node: cst.Yield) -> None:
        self.blocked = True

    def visit_Global(self, node: cst.Global) -> None:
        self.blocked = True

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.blocked = True

    def visit_Return(self, node: cst.Return) -> None:
        self.returns += 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _inlinable(func: cst.FunctionDef) -> bool:
    plain = all(
        m.matches(d, m.Decorator(decorator=m.Name("staticmethod"))) for d in func.decorators
    )
    if not plain or func.asynchronous is not None:
        return False
    params = func.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT and params.star_arg is not None:
        return False
    if params.star_kwarg is not None or params.posonly_params or params.kwonly_params:
        return False
    facts = _Facts()
    statements = body_statements(func.body)
    for statement in statements:
        statement.visit(facts)
    if facts.blocked:
        return False
    last = statements[-1] if statements else None
    ends_in_return = m.matches(last, m.SimpleStatementLine(body=[m.Return()]))
    return facts.returns == (1 if ends_in_return else 0)


def _methods(module: cst.Module) -> dict[str, list[cst.FunctionDef]]:
    found: dict[str, list[cst.FunctionDef]] = {}
    for statement in module.body:
        if isinstance(statement, cst.ClassDef):
            for item in body_statements(statement.body):
                if isinstance(item, cst.FunctionDef):
                    found.setdefault(item.name.value, []).append(item)
    return found


def _class_method(module: cst.Module, class_name: str, method: str) -> cst.FunctionDef | None:
    for statement in module.body:
        if m.matches(statement, m.ClassDef(name=m.Name(class_name))):
            assert isinstance(statement, cst.ClassDef)
            for item in body_statements(statement.body):
                if m.matches(item, m.FunctionDef(name=m.Name(method))):
                    return item  # type: ignore[return-value]
    return None


def _call_site(statement: cst.BaseStatement) -> tuple[cst.Call, cst.BaseExpression | None] | None:
    """The call and its assignment target, for `f(...)` and `x = f(...)` lines."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return small.value, None
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.value, cst.Call)
    ):
        return small.value, small.targets[0].target
    return None


def _callee(
    module: cst.Module, call: cst.Call
) -> tuple[cst.FunctionDef, cst.BaseExpression | None] | None:
    """The function a call runs and the expression bound to `self`, when it can be known."""
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    classes = {s.name.value for s in module.body if isinstance(s, cst.ClassDef)}
    methods = _methods(module)
    func = call.func
    if isinstance(func, cst.Name):
        if func.value in functions:
            return functions[func.value], None
        if func.value not in classes and len(methods.get("forward", ())) == 1:
            return methods["forward"][0], func  # an nn.Module called as `model(x)`
    if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("apply"))):
        assert isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
        forward = _class_method(module, func.value.value, "forward")
        if forward is not None:
            return forward, cst.Name("None")  # autograd.Function: forward(ctx, ...) with ctx=None
    if (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Name)
        and len(methods.get(func.attr.value, ())) == 1
    ):
        return methods[func.attr.value][0], func.value
    return None


def _inline_call(
    module: cst.Module, statement: cst.BaseStatement
) -> list[cst.BaseStatement] | None:
    site = _call_site(statement)
    if site is None:
        return None
    call, target = site
    found = _callee(module, call)
    if found is None:
        return None
    func, self_value = found
    if not _inlinable(func):
        return None
    if any(arg.star for arg in call.args):
        return None
    params = list(func.params.params)
    if self_value is not None:
        if not params:
            return None
        params = params[1:]
    bound: dict[str, cst.BaseExpression] = {}
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) > len(params):
        return None
    for param, arg in zip(params, positional, strict=False):
        bound[param.name.value] = arg.value
    for arg in call.args:
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg.value
    renames: dict[str, cst.BaseExpression] = {}
    if self_value is not None:
        renames[func.params.params[0].name.value] = self_value
    prelude: list[cst.BaseStatement] = []
    for param in params:
        name = param.name.value
        value = bound.get(name, param.default)
        if value is None:
            return None
        if isinstance(value, cst.Name):
            if value.value != name:
                renames[name] = value
        else:
            prelude.append(
                cst.SimpleStatementLine(
                    body=[cst.Assign([cst.AssignTarget(cst.Name(name))], value)]
                )
            )
    body = body_statements(func.body)
    try:
        body = [s.visit(RenameVariables(renames)) for s in body] if renames else body
    except (cst.CSTValidationError, ValueError, TypeError):
        return None
    result: cst.BaseExpression | None = None
    if body and m.matches(body[-1], m.SimpleStatementLine(body=[m.Return()])):
        last = body.pop()
        assert isinstance(last, cst.SimpleStatementLine)
        ret = last.body[0]
        assert isinstance(ret, cst.Return)
        result = ret.value
    tail: list[cst.BaseStatement] = []
    if target is not None:
        tail.append(
            cst.SimpleStatementLine(
                body=[cst.Assign([cst.AssignTarget(target)], result or cst.Name("None"))]
            )
        )
    elif result is not None and not isinstance(result, cst.Name):
        tail.append(cst.SimpleStatementLine(body=[cst.Expr(result)]))
    return [*prelude, *body, *tail] or [PASS_LINE]


def inline_calls(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Replace `x = f(a)` (or `y = model(x)`, `obj.method(a)`) by the body it runs, parameters
    bound and the return assigned; the function goes with it when nothing else names it, so
    the script gets flatter."""

    def apply_at(code: str, index: int) -> str | None:
        module = parse(code)
        if module is None:
            return None
        statements = statements_of(module)
        if index >= len(statements):
            return None
        statement = statements[index]
        site = _call_site(statement)
        found = None if site is None else _callee(module, site[0])
        new = _inline_call(module, statement)
        if new is None or found is None:
            return None
        inlined = replace_in(code, module, {id(statement): new})
        if inlined is None:
            return None
        return _drop_unnamed_function(inlined, found[0].name.value) or inlined

    yield from sweep(code, count_statements, apply_at)


def _drop_unnamed_function(code: str, name: str) -> str | None:
    """Remove the function or method `name` when no other code mentions it."""
    module = parse(code)
    if module is None or name_counts(module).get(name, 0) != 1:
        return None
    defs = [s for s in statements_of(module) if m.matches(s, m.FunctionDef(name=m.Name(name)))]
    return replace_in(code, module, {id(d): [] for d in defs}) if defs else None
