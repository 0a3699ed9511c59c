"""Named libcst passes that cut a user's script down, one candidate module text at a time.

A pass is a generator: given the best code so far it yields candidate texts, and the reducer
sends back whether each was accepted (`accepted = yield candidate`). After an acceptance the pass
continues from the accepted text, so a sweep survives the best changing mid-pass. A pass never
judges a candidate itself: the reducer's sort key and signature check do that. Code that libcst
cannot parse or rebuild (`ParserSyntaxError`, `CSTValidationError`) means "cannot apply".
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as m
import libcst.metadata

from reprocut.case import Generated, Literal, TensorSpec

SourcePass = Callable[[str, "PassContext"], Generator[str, bool, None]]


@dataclass(frozen=True, slots=True)
class PassContext:
    """What passes may know beyond the code: where sibling modules live, recorded tensors."""

    search_dirs: tuple[Path, ...] = ()  # the script's directory and cwd: sibling modules
    # tensors that reached the failing call, by argument position (None: not a tensor)...
    specs: tuple[TensorSpec | None, ...] = ()
    # ...and the tensor parameters of the function that makes it, by name
    named_specs: tuple[tuple[str, TensorSpec], ...] = ()
    focus: str | None = None  # the failing source line's text (its call is tried first)
    extra: dict[str, Any] = field(default_factory=dict)


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
PASS_LINE = cst.SimpleStatementLine(body=[cst.Pass()])
TENSOR_FACTORIES = frozenset(
    {"randn", "rand", "zeros", "ones", "full", "randint", "arange", "empty", "empty_strided",
     "tensor"}
)  # fmt: skip


# --- helpers ---------------------------------------------------------------------------------


def parse(code: str) -> cst.Module | None:
    try:
        return cst.parse_module(code)
    except (cst.ParserSyntaxError, RecursionError):
        return None


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
        new = module.visit(transformer).code
    except (cst.CSTValidationError, ValueError, TypeError):
        return None
    if new == code or parse(new) is None:
        return None
    try:
        compile(new, "<candidate>", "exec")
    except (SyntaxError, ValueError):
        return None
    return new


def sweep(
    code: str, count: Callable[[str], int], apply_at: Callable[[str, int], str | None]
) -> Generator[str, bool, str]:
    """Try `apply_at(code, i)` for every site i, from the last to the first; returns the code
    as it stands after the sweep.

    Going backwards keeps the indices of sites not yet tried stable when one is removed.
    """
    i = count(code) - 1
    while i >= 0:
        candidate = apply_at(code, i)
        if candidate is not None and (yield candidate):
            code = candidate
        i = min(i - 1, count(code) - 1)
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
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def visit_Name(self, node: cst.Name) -> None:
        self.counts[node.value] = self.counts.get(node.value, 0) + 1


def name_counts(node: cst.CSTNode) -> dict[str, int]:
    counter = _NameCounter()
    node.visit(counter)
    return counter.counts


class _StatementIndexer(cst.CSTVisitor):
    """Post-order list of statements that sit in a block (elif branches are not)."""

    def __init__(self) -> None:
        self.statements: list[cst.BaseStatement] = []
        self._elifs: set[int] = set()

    def visit_If(self, node: cst.If) -> None:
        if isinstance(node.orelse, cst.If):
            self._elifs.add(id(node.orelse))

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if m.matches(original_node, STATEMENT) and id(original_node) not in self._elifs:
            self.statements.append(original_node)  # type: ignore[arg-type]


def statements_of(module: cst.Module) -> list[cst.BaseStatement]:
    indexer = _StatementIndexer()
    module.visit(indexer)
    return indexer.statements


class _ReplaceStatements(cst.CSTTransformer):
    """Replace statements (by identity) with lists of statements; empty blocks get `pass`."""

    def __init__(self, replacements: dict[int, Sequence[cst.BaseStatement]]) -> None:
        super().__init__()
        self.replacements = replacements

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
    return _replace_in(code, module, replacements)


def _replace_in(
    code: str, module: cst.Module, replacements: dict[int, Sequence[cst.BaseStatement]]
) -> str | None:
    try:
        new = module.visit(_ReplaceStatements(replacements)).code
    except (cst.CSTValidationError, ValueError, TypeError):
        return None
    if new == code:
        return None
    try:
        compile(new, "<candidate>", "exec")
    except (SyntaxError, ValueError):
        return None
    return new


def _statement_site(
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
    return _replace_in(code, module, {id(statements[index]): new})


def count_statements(code: str) -> int:
    module = parse(code)
    return 0 if module is None else len(statements_of(module))


# --- delete_statements -----------------------------------------------------------------------


def delete_statements(code: str, context: PassContext) -> Generator[str, bool, None]:
    """ddmin over statements by post-order index: big chunks first, from the end backwards."""
    n = count_statements(code)
    size = max(n // 2, 1)
    while size >= 1:
        start = count_statements(code) - size
        while start > -size:
            module = parse(code)
            if module is None:
                return
            statements = statements_of(module)
            lo = max(start, 0)
            chunk = statements[lo : start + size]
            candidate = _replace_in(code, module, {id(s): [] for s in chunk}) if chunk else None
            if candidate is not None and (yield candidate):
                code = candidate
                start = min(start, count_statements(code)) - size
            else:
                start -= size
        if size == 1:
            break
        size //= 2


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


def unwrap_blocks(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Replace a block by its contents: a loop by one iteration, an `if` by a branch, a `with`
    or `try` by its body."""
    i = count_statements(code) - 1
    while i >= 0:
        module = parse(code)
        if module is None:
            return
        statements = statements_of(module)
        if i >= len(statements):
            i = len(statements) - 1
            continue
        accepted = False
        for option in block_alternatives(statements[i]):
            candidate = _replace_in(code, module, {id(statements[i]): option})
            if candidate is not None and (yield candidate):
                code, accepted = candidate, True
                break
        i -= 1
        if accepted:
            i = min(i + 1, count_statements(code) - 1)  # the unwrapped body may hold more blocks


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


def _import_module_name(statement: cst.BaseSmallStatement) -> str | None:
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
            name = _import_module_name(statement.body[0])
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


def _sibling_body(path: Path) -> list[cst.BaseStatement] | None:
    try:
        module = cst.parse_module(path.read_text())
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return None
    return [
        s for s in module.body if not m.matches(s, MAIN_GUARD) and not m.matches(s, FUTURE_IMPORT)
    ]


def inline_sibling_imports(code: str, context: PassContext) -> Generator[str, bool, None]:
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
    name = _import_module_name(statement)
    assert name is not None
    path = sibling_file(name, search_dirs)
    body = None if path is None else _sibling_body(path)
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
        return _replace_in(code, module, {id(line): body})
    assert isinstance(statement, cst.Import)
    alias = statement.names[0]
    if isinstance(alias.name, cst.Attribute) and alias.asname is None:
        return None  # `import pkg.mod` binds `pkg`: its attribute chains are left alone
    bound = alias.asname.name if alias.asname is not None else alias.name
    assert isinstance(bound, cst.Name)
    pasted = _replace_in(code, module, {id(line): body})
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


class _Rename(cst.CSTTransformer):
    """Rename variables (not attribute names or keyword names) in a function body."""

    def __init__(self, names: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.names = names

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> Any:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> Any:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Any:
        return self.names.get(original_node.value, updated_node)


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
        body = [s.visit(_Rename(renames)) for s in body] if renames else body
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


def inline_calls(code: str, context: PassContext) -> Generator[str, bool, None]:
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
        inlined = _replace_in(code, module, {id(statement): new})
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
    return _replace_in(code, module, {id(d): [] for d in defs}) if defs else None


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
        if all(isinstance(t, cst.Name) for t in targets):
            return [t.value for t in targets]  # type: ignore[attr-defined]
    return None


def unused_definitions(module: cst.Module) -> list[cst.BaseStatement]:
    """Definitions none of whose names are mentioned anywhere outside the definition itself."""
    totals = name_counts(module)
    unused = []
    for statement in statements_of(module):
        names = _bound_names(statement)
        if not names:
            continue
        inside = name_counts(statement)
        if all(totals.get(n, 0) - inside.get(n, 0) == 0 for n in names):
            unused.append(statement)
    return unused


def remove_unused_definitions(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Drop imports, functions, classes and assignments nothing refers to: all, then one by one."""
    module = parse(code)
    if module is None:
        return
    unused = unused_definitions(module)
    if not unused:
        return
    candidate = _replace_in(code, module, {id(s): [] for s in unused})
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
        candidate = _replace_in(code, module, {id(statement): []})
        if candidate is not None and (yield candidate):
            code = candidate


# --- shrink_integers -------------------------------------------------------------------------


class _Integers(cst.CSTVisitor):
    """Integer literals outside tensor atoms, in source order."""

    def __init__(self) -> None:
        self.found: list[cst.Integer] = []

    def visit_Call(self, node: cst.Call) -> bool:
        return not is_constant(node)

    def visit_Integer(self, node: cst.Integer) -> None:
        self.found.append(node)


def integers_of(module: cst.Module) -> list[cst.Integer]:
    visitor = _Integers()
    module.visit(visitor)
    return visitor.found


class _SetInteger(cst.CSTTransformer):
    def __init__(self, target: cst.Integer, value: int) -> None:
        super().__init__()
        self.target, self.value = target, value

    def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> Any:
        return cst.Integer(str(self.value)) if original_node is self.target else updated_node


def integer_value(node: cst.Integer) -> int:
    return int(node.value.replace("_", ""), 0)


def smaller_integers(value: int) -> list[int]:
    """Candidates for an integer, most drastic first: 0, 1, half, one less."""
    options = [0, 1, value // 2, value - 1]
    return [v for i, v in enumerate(options) if 0 <= v < value and v not in options[:i]]


def shrink_integers(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Make integer constants (epochs, batch and hidden sizes) small: 0, 1, halve, minus one."""
    module = parse(code)
    if module is None:
        return
    i = len(integers_of(module)) - 1
    while i >= 0:
        module = parse(code)
        if module is None:
            return
        found = integers_of(module)
        if i >= len(found):
            i = len(found) - 1
            continue
        improved = False
        for value in smaller_integers(integer_value(found[i])):
            candidate = transform(code, _SetInteger(found[i], value), module)
            if candidate is not None and (yield candidate):
                code, improved = candidate, True
                break
        if not improved:
            i -= 1  # on success, stay: the new value may shrink further


# --- drop_arguments --------------------------------------------------------------------------


class _Droppable(cst.CSTVisitor):
    """Keyword arguments and last positional arguments of calls: ones a default may replace."""

    def __init__(self) -> None:
        self.found: list[cst.Arg] = []

    def visit_Call(self, node: cst.Call) -> None:
        if any(arg.star for arg in node.args):
            return
        positional = [a for a in node.args if a.keyword is None]
        for arg in node.args:
            if arg.keyword is not None or (arg is positional[-1]):
                self.found.append(arg)


def droppable_arguments(code: str) -> list[cst.Arg]:
    module = parse(code)
    if module is None:
        return []
    visitor = _Droppable()
    module.visit(visitor)
    return visitor.found


class _DropArg(cst.CSTTransformer):
    def __init__(self, target: cst.Arg) -> None:
        super().__init__()
        self.target = target

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> Any:
        if not any(a is self.target for a in original_node.args):
            return updated_node
        args = [
            new for old, new in zip(original_node.args, updated_node.args, strict=True)
            if old is not self.target
        ]  # fmt: skip
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(args=args)


def drop_arguments(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Leave out keyword and trailing arguments, so their defaults apply."""

    def apply_at(code: str, index: int) -> str | None:
        module = parse(code)
        if module is None:
            return None
        visitor = _Droppable()
        module.visit(visitor)
        if index >= len(visitor.found):
            return None
        return transform(code, _DropArg(visitor.found[index]), module)

    yield from sweep(code, lambda c: len(droppable_arguments(c)), apply_at)


# --- replace_with_specs ----------------------------------------------------------------------


def literal(value: Any) -> cst.BaseExpression:
    """A Python value as an expression node (ints, floats, bools, strings, tuples)."""
    if isinstance(value, bool) or value is None:
        return cst.Name(repr(value))
    if isinstance(value, int):
        node: cst.BaseExpression = cst.Integer(str(abs(value)))
        return cst.UnaryOperation(cst.Minus(), node) if value < 0 else node
    if isinstance(value, float):
        node = cst.Float(repr(abs(value)))
        return cst.UnaryOperation(cst.Minus(), node) if value < 0 else node
    if isinstance(value, str):
        return cst.SimpleString(repr(value))
    if isinstance(value, tuple):
        elements = [cst.Element(literal(v)) for v in value]
        if len(elements) == 1:
            elements = [elements[0].with_changes(comma=cst.Comma())]
        return cst.Tuple(elements)
    raise TypeError(f"no literal for {type(value).__name__}")


def _kw(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def spec_expression(spec: TensorSpec) -> cst.BaseExpression:
    """A tensor with the spec's shape, dtype, device, strides and storage offset.

    A non-contiguous or offset spec is built as a flat storage viewed with `as_strided`, so an
    expanded (stride 0) or offset view reaches the kernel exactly as it did in the user's run.
    """
    dtype = cst.parse_expression(f"torch.{spec.dtype}")
    options = [_kw("dtype", dtype)]
    if spec.device != "cpu":
        options.append(_kw("device", literal(spec.device)))
    plain = spec.is_contiguous and spec.storage_offset == 0
    shape: tuple[int, ...] = spec.shape if plain else (spec.storage_numel,)
    values = spec.values
    is_float = spec.dtype.startswith(("float", "bfloat", "complex"))
    kind = values.kind if isinstance(values, Generated) else ("randn" if is_float else "zeros")
    if kind in {"randn", "rand"} and not is_float:
        kind = "zeros"
    if isinstance(values, Literal) and len(values.values) == (spec.numel if plain else -1):
        base = cst.Call(
            cst.parse_expression("torch.tensor"),
            [cst.Arg(literal(tuple(values.values))), *options],
        )
        built = cst.Call(cst.Attribute(base, cst.Name("reshape")), [cst.Arg(literal(spec.shape))])
    elif kind == "randint":
        assert isinstance(values, Generated)
        args = [literal(values.low), literal(values.high), literal(shape)]
        built = cst.Call(cst.parse_expression("torch.randint"), [*map(cst.Arg, args), *options])
    elif kind == "full":
        assert isinstance(values, Generated)
        args = [literal(shape), literal(values.low)]
        built = cst.Call(cst.parse_expression("torch.full"), [*map(cst.Arg, args), *options])
    else:
        name = kind if kind in {"randn", "rand", "zeros", "ones"} else "zeros"
        built = cst.Call(cst.parse_expression(f"torch.{name}"), [cst.Arg(literal(shape)), *options])
    if not plain:
        stride = spec.stride if spec.stride is not None else _contiguous(spec.shape)
        built = cst.Call(
            cst.Attribute(built, cst.Name("as_strided")),
            [cst.Arg(literal(spec.shape)), cst.Arg(literal(tuple(stride))),
             cst.Arg(literal(spec.storage_offset))],
        )  # fmt: skip
    return built


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(size, 1)
    return tuple(reversed(stride))


def _focus_callee(focus: str | None) -> str | None:
    """The called expression of the failing line (`add_kernel[grid]`), as code."""
    if not focus:
        return None
    try:
        statement = cst.parse_statement(focus.strip() + "\n")
    except cst.ParserSyntaxError:
        return None
    calls = m.findall(statement, m.Call())
    if not calls:
        return None
    call = calls[0]
    assert isinstance(call, cst.Call)
    return cst.Module(body=[]).code_for_node(call.func)


def calls_focus(code: str, focus: str | None) -> bool | None:
    """Does the code still make the failing call? None when there is no focus call to look for."""
    callee = _focus_callee(focus)
    module = parse(code)
    if callee is None or module is None:
        return None
    return any(
        module.code_for_node(call.func) == callee  # type: ignore[attr-defined]
        for call in m.findall(module, m.Call())
    )


class _SpecSites(cst.CSTVisitor):
    """Call arguments that are expressions (not constants), of the focus call when there is one,
    each with its position in the call (the position of the recorded spec to try first)."""

    def __init__(self, module: cst.Module, callee: str | None) -> None:
        self.module, self.callee = module, callee
        self.found: list[tuple[cst.Arg, int]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.callee is not None and self.module.code_for_node(node.func) != self.callee:
            return
        for position, arg in enumerate(node.args):
            if (
                not arg.star
                and not is_constant(arg.value)
                and not isinstance(arg.value, cst.Lambda)
            ):
                self.found.append((arg, position))


def spec_sites(module: cst.Module, focus: str | None) -> list[tuple[cst.Arg, int]]:
    callee = _focus_callee(focus)
    visitor = _SpecSites(module, callee)
    module.visit(visitor)
    if not visitor.found and callee is not None and not calls_focus(module.code, focus):
        visitor = _SpecSites(module, None)
        module.visit(visitor)
    return visitor.found


class _ReplaceArg(cst.CSTTransformer):
    def __init__(self, target: cst.Arg, value: cst.BaseExpression) -> None:
        super().__init__()
        self.target, self.value = target, value

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> Any:
        return (
            updated_node.with_changes(value=self.value)
            if original_node is self.target
            else updated_node
        )


class _SpecForName(cst.CSTTransformer):
    """Every read of `name` inside `scope` becomes the spec's tensor (writes stay)."""

    METADATA_DEPENDENCIES = (cst.metadata.ExpressionContextProvider,)

    def __init__(self, scope: cst.CSTNode, name: str, value: cst.BaseExpression) -> None:
        super().__init__()
        self.scope, self.name, self.value = scope, name, value
        self.depth = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.scope:
            self.depth += 1
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        if original_node is self.scope:
            self.depth -= 1
        if (
            self.depth
            and isinstance(original_node, cst.Name)
            and original_node.value == self.name
            and self.get_metadata(cst.metadata.ExpressionContextProvider, original_node, None)
            == cst.metadata.ExpressionContext.LOAD
        ):
            return self.value
        return updated_node


class _Enclosing(cst.CSTVisitor):
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


def _spec_candidate(
    code: str, module: cst.Module, arg: cst.Arg, value: cst.BaseExpression
) -> str | None:
    """A Name argument is replaced wherever its function reads it (so what computed it can
    go, `n = x.numel()` included); any other argument only where it is."""
    if isinstance(arg.value, cst.Name):
        enclosing = _Enclosing(arg)
        module.visit(enclosing)
        scope = enclosing.found if enclosing.found is not None else module
        return _replace_name(code, module, scope, arg.value.value, value)
    return transform(code, _ReplaceArg(arg, value), module)


def _focus_scope(module: cst.Module, focus: str | None) -> cst.CSTNode | None:
    """The function that makes the failing call (the module when it is made at top level)."""
    callee = _focus_callee(focus)
    if callee is None:
        return None
    for call in m.findall(module, m.Call()):
        if module.code_for_node(call.func) == callee:  # type: ignore[attr-defined]
            enclosing = _Enclosing(call)
            module.visit(enclosing)
            return enclosing.found if enclosing.found is not None else module
    return None


def _replace_name(
    code: str, module: cst.Module, scope: cst.CSTNode, name: str, value: cst.BaseExpression
) -> str | None:
    wrapper = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True)
    try:
        new = wrapper.visit(_SpecForName(scope, name, value)).code
    except (cst.CSTValidationError, ValueError, TypeError):
        return None
    return new if new != code and parse(new) is not None else None


def replace_with_specs(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Replace what reaches the failing call by tensors built from recorded specs, so what
    computed it (model, data pipeline) can go: first the tensor parameters of the function
    making the call, then the call's arguments (the spec at the argument's position first)."""
    for name, spec in context.named_specs:
        module = parse(code)
        scope = None if module is None else _focus_scope(module, context.focus)
        if module is None or scope is None:
            break
        candidate = _replace_name(code, module, scope, name, spec_expression(spec))
        if candidate is not None and (yield candidate):
            code = candidate
    specs = context.specs
    tensors = [s for s in specs if s is not None]
    if not tensors:
        return
    i = 0
    while True:
        module = parse(code)
        if module is None:
            return
        sites = spec_sites(module, context.focus)
        if i >= len(sites):
            return
        arg, position = sites[i]
        if position < len(specs):  # recorded at this position: that spec, or not a tensor
            order = [] if specs[position] is None else [specs[position]]
        else:
            order = tensors
        accepted = False
        for spec in order:
            candidate = _spec_candidate(code, module, arg, spec_expression(spec))
            if candidate is not None and (yield candidate):
                code, accepted = candidate, True
                break
        if not accepted:
            i += 1  # an accepted site became a constant: it is no longer in the list


# --- simplify_expressions ------------------------------------------------------------------

SIMPLE_VALUES = ("0", "None")


class _ValueSites(cst.CSTVisitor):
    """Right-hand sides of assignments and call arguments that are not constants already."""

    def __init__(self) -> None:
        self.found: list[cst.BaseExpression] = []

    def _add(self, value: cst.BaseExpression) -> None:
        if not is_constant(value) and not isinstance(value, cst.Lambda):
            self.found.append(value)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._add(node.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        if not node.star:
            self._add(node.value)


class _ReplaceExpression(cst.CSTTransformer):
    def __init__(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        super().__init__()
        self.target, self.value = target, value

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        return self.value if original_node is self.target else updated_node


def simplify_expressions(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Replace a computed value (an assignment's right side, an argument) by `0` or `None`."""
    i = 0
    while True:
        module = parse(code)
        if module is None:
            return
        visitor = _ValueSites()
        module.visit(visitor)
        if i >= len(visitor.found):
            return
        for text in SIMPLE_VALUES:
            replacement = cst.parse_expression(text)
            candidate = transform(code, _ReplaceExpression(visitor.found[i], replacement), module)
            if candidate is not None and (yield candidate):
                code = candidate
                break
        i += 1


# --- hoist_subexpressions -------------------------------------------------------------------


def _children(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """Sub-expressions that may stand in for a node: `a.m(x)` -> `a`, `a[i]` -> `a`, ..."""
    if isinstance(node, cst.Call):
        options = [a.value for a in node.args if a.keyword is None and not a.star][:1]
        if isinstance(node.func, cst.Attribute):
            options.insert(0, node.func.value)
        return options
    if isinstance(node, cst.Subscript):
        return [node.value]
    if isinstance(node, cst.BinaryOperation | cst.BooleanOperation):
        return [node.left, node.right]
    if isinstance(node, cst.Comparison):
        return [node.left]
    if isinstance(node, cst.UnaryOperation):
        return [node.expression]
    return []


class _HoistSites(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found: list[cst.BaseExpression] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseExpression) and is_constant(node):
            return False
        if _children(node):
            self.found.append(node)  # type: ignore[arg-type]
        return True


def _value_statement(statement: cst.BaseStatement) -> list[cst.BaseStatement] | None:
    """`x = f(a)` or `x += f(a)` -> `f(a)`: the call may matter, the name may not."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign | cst.AugAssign) and m.findall(small.value, m.Call()):
        return [statement.with_changes(body=[cst.Expr(small.value)])]
    return None


def hoist_subexpressions(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Replace an expression by one of its parts (`(model(x).argmax() == y).sum()` -> `model(x)`)
    and an assignment whose name is not needed by its value."""
    code = yield from sweep(
        code,
        count_statements,
        lambda code, i: _statement_site(code, i, lambda _, s: _value_statement(s)),
    )
    i = 0
    while True:
        module = parse(code)
        if module is None:
            return
        visitor = _HoistSites()
        module.visit(visitor)
        if i >= len(visitor.found):
            return
        site = visitor.found[i]
        accepted = False
        for child in _children(site):
            candidate = transform(code, _ReplaceExpression(site, child), module)
            if candidate is not None and (yield candidate):
                code, accepted = candidate, True
                break
        if not accepted:
            i += 1


# --- strip_comments --------------------------------------------------------------------------


class _StripComments(cst.CSTTransformer):
    def leave_EmptyLine(self, original_node: cst.EmptyLine, updated_node: cst.EmptyLine) -> Any:
        return cst.RemoveFromParent() if updated_node.comment is not None else updated_node

    def leave_TrailingWhitespace(
        self, original_node: cst.TrailingWhitespace, updated_node: cst.TrailingWhitespace
    ) -> Any:
        return updated_node.with_changes(comment=None, whitespace=cst.SimpleWhitespace(""))


def strip_comments(code: str, context: PassContext) -> Generator[str, bool, None]:
    """Remove comments: in a repro they describe code that is no longer there."""
    candidate = transform(code, _StripComments())
    if candidate is not None:
        yield candidate


PASSES: tuple[SourcePass, ...] = (
    inline_sibling_imports,
    strip_comments,
    replace_with_specs,
    delete_statements,
    unwrap_blocks,
    inline_calls,
    remove_unused_definitions,
    simplify_expressions,
    hoist_subexpressions,
    drop_arguments,
    shrink_integers,
)


def candidates(source_pass: SourcePass, code: str, context: PassContext) -> Iterator[str]:
    """Every candidate a pass makes from `code`, none accepted (for tests and inspection)."""
    generator = source_pass(code, context)
    try:
        candidate = next(generator)
        while True:
            yield candidate
            candidate = generator.send(False)
    except StopIteration:
        return
