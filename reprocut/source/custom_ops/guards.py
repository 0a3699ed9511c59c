"""A module's top level with its guards resolved to the branches that ran.

Users define custom ops under guards: `try: import triton / except ImportError: triton = None`
then `if triton is not None:`; `if not torch.cuda.is_available(): sys.exit(...)` before building
an extension; `if TYPE_CHECKING:`. A repro needs the branch that ran when the op was registered,
not the guard: the op was registered and called, so a branch that exits did not run, a branch
that registers it did, an import guard ran its `try` when the modules it imports can be found,
and a test over what those guards bound (`triton is not None`, `HAS_TRITON`, `DEVICE != "cuda"`)
can be worked out. `flatten` lifts those branches to the top level; a guard it cannot resolve
stays whole.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

from reprocut.source.custom_ops.registration import walk

_EMPTY = cst.Module([])
IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})
BROAD_ERRORS = frozenset({"Exception", "BaseException"})  # an import guard when only imports fail
EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit", "SystemExit"})


class _Unknown:
    """A test's value that cannot be worked out statically."""


UNKNOWN = _Unknown()


class _Module:
    """An imported module's value in a test: truthy, and not None."""

    def __repr__(self) -> str:
        return "<module>"


MODULE = _Module()


@dataclass(slots=True)
class Facts:
    """What is known at a point of the module: constants names were bound to, whether CUDA was
    available when the op failed, and which modules could be imported."""

    values: dict[str, object] = field(default_factory=dict)
    cuda: bool | None = None
    importable: Callable[[str], bool] = lambda name: _findable(name)


def _findable(name: str) -> bool:
    """Can `import name` find its top-level package (looked up without importing it)?"""
    try:
        return importlib.util.find_spec(name.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def code_of(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def flatten(
    body: Sequence[cst.BaseStatement],
    facts: Facts,
    registers: Callable[[cst.CSTNode], bool],
) -> list[cst.BaseStatement]:
    """`body` with every guard it can resolve replaced by the branch that ran, recursively;
    `from __future__` imports, `if __name__ == "__main__":` blocks and exits dropped.
    `registers(node)`: does the node hold the op's registration (its branch ran)."""
    flat: list[cst.BaseStatement] = []
    for statement in body:
        flat.extend(_resolve(statement, facts, registers))
    return flat


def _resolve(
    statement: cst.BaseStatement, facts: Facts, registers: Callable[[cst.CSTNode], bool]
) -> list[cst.BaseStatement]:
    if isinstance(statement, cst.SimpleStatementLine):
        if _is_future(statement) or _exits(statement):
            return []
        _learn(statement, facts)
        return [statement]
    if isinstance(statement, cst.If):
        branch = _taken_branch(statement, facts, registers)
        if branch is None:
            _forget(statement, facts)
            return [statement]
        return flatten(branch, facts, registers)
    if isinstance(statement, cst.Try):
        branch = _try_branch(statement, facts, registers)
        if branch is None:
            _forget(statement, facts)
            return [statement]
        return flatten(branch, facts, registers)
    _forget(statement, facts)
    return [statement]


# --- if --------------------------------------------------------------------------------------


def _taken_branch(
    statement: cst.If, facts: Facts, registers: Callable[[cst.CSTNode], bool]
) -> list[cst.BaseStatement] | None:
    """The statements of the branch that ran ([] for none), or None when it cannot be told."""
    if is_main_guard(statement):
        return []
    body = list(statement.body.body)
    orelse = _else_statements(statement.orelse)
    in_body = any(registers(s) for s in body)
    in_else = any(registers(s) for s in orelse)
    if in_body != in_else:  # the op was registered: its branch ran
        return body if in_body else orelse
    body_exits = ends_in_exit(body)
    else_exits = statement.orelse is not None and ends_in_exit(orelse)
    if body_exits != else_exits:  # the op was registered and called: the exit did not run
        return orelse if body_exits else body
    value = evaluate(statement.test, facts)
    if value is not UNKNOWN:
        return body if value else orelse
    return None


def _else_statements(orelse: cst.If | cst.Else | None) -> list[cst.BaseStatement]:
    if orelse is None:
        return []
    if isinstance(orelse, cst.If):  # elif: a nested if of its own
        return [orelse]
    return list(orelse.body.body)


def is_main_guard(statement: cst.CSTNode) -> bool:
    """`if __name__ == "__main__":`."""
    return isinstance(statement, cst.If) and any(
        isinstance(n, cst.Name) and n.value == "__name__" for n in walk(statement.test)
    )


def ends_in_exit(statements: Sequence[cst.BaseStatement]) -> bool:
    """Does this block end the program: `sys.exit(...)`, `raise SystemExit`, any `raise`."""
    return (
        bool(statements)
        and isinstance(statements[-1], cst.SimpleStatementLine)
        and _exits(statements[-1])
    )


def _exits(line: cst.SimpleStatementLine) -> bool:
    last = line.body[-1]
    if isinstance(last, cst.Raise):
        return True
    return (
        isinstance(last, cst.Expr)
        and isinstance(last.value, cst.Call)
        and code_of(last.value.func) in EXITS
    )


# --- try -------------------------------------------------------------------------------------


def _try_branch(
    statement: cst.Try, facts: Facts, registers: Callable[[cst.CSTNode], bool]
) -> list[cst.BaseStatement] | None:
    """An import guard's branch that ran: the `try` (and its `else`) when its imports can be
    found, else the handler; any `try` whose body registers the op ran its body."""
    body = list(statement.body.body)
    orelse = list(statement.orelse.body.body) if statement.orelse else []
    final = list(statement.finalbody.body.body) if statement.finalbody else []
    in_body = any(registers(s) for s in [*body, *orelse])
    handler = next((h for h in statement.handlers if registers(h)), None)
    if in_body:
        return [*body, *orelse, *final]
    if handler is not None:
        return [*handler.body.body, *final]
    if not _is_import_guard(statement):
        return None
    if all(facts.importable(name) for name in imported_modules(body)):
        return [*body, *orelse, *final]
    caught = next(h for h in statement.handlers if _catches_import_error(h, body))
    return [*caught.body.body, *final]


def _is_import_guard(statement: cst.Try) -> bool:
    body = list(statement.body.body)
    return bool(imported_modules(body)) and any(
        _catches_import_error(h, body) for h in statement.handlers
    )


def _catches_import_error(handler: cst.ExceptHandler, body: Sequence[cst.BaseStatement]) -> bool:
    if handler.type is None:
        names = BROAD_ERRORS
    else:
        names = {n.value for n in walk(handler.type) if isinstance(n, cst.Name)}
    if names & IMPORT_ERRORS:
        return True
    # `except Exception:` guards an import when nothing but imports and constants can fail
    return bool(names & BROAD_ERRORS) and all(_only_imports_or_constants(s) for s in body)


def _only_imports_or_constants(statement: cst.BaseStatement) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, (cst.Import, cst.ImportFrom)):
            continue
        if isinstance(small, cst.Assign) and _literal(small.value) is not UNKNOWN:
            continue
        return False
    return True


def imported_modules(statements: Sequence[cst.BaseStatement]) -> list[str]:
    """The modules the simple import lines among `statements` import."""
    names = []
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                names.extend(code_of(alias.name) for alias in small.names)
            elif isinstance(small, cst.ImportFrom) and small.module and not small.relative:
                names.append(code_of(small.module))
    return names


# --- facts -----------------------------------------------------------------------------------


def _learn(line: cst.SimpleStatementLine, facts: Facts) -> None:
    """Names bound by one line: a module, a constant, or (else) nothing known any more."""
    for small in line.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                bound = alias.asname.name if alias.asname else alias.name
                name = code_of(bound).split(".")[0]
                facts.values[name] = MODULE
        elif isinstance(small, cst.ImportFrom):
            if not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    facts.values.pop(code_of(bound), None)  # an attribute: a value unknown
        elif isinstance(small, (cst.Assign, cst.AnnAssign)):
            value = evaluate(small.value, facts) if small.value is not None else UNKNOWN
            targets = (
                [t.target for t in small.targets]
                if isinstance(small, cst.Assign)
                else [small.target]
            )
            for target in targets:
                if isinstance(target, cst.Name) and value is not UNKNOWN:
                    facts.values[target.value] = value
                else:
                    for node in walk(target):
                        if isinstance(node, cst.Name):
                            facts.values.pop(node.value, None)


def _forget(statement: cst.CSTNode, facts: Facts) -> None:
    """A statement kept whole binds who knows what: nothing it could bind is known now."""
    for node in walk(statement):
        if isinstance(node, cst.Name):
            facts.values.pop(node.value, None)


def _is_future(line: cst.SimpleStatementLine) -> bool:
    first = line.body[0]
    return (
        isinstance(first, cst.ImportFrom)
        and isinstance(first.module, cst.Name)
        and first.module.value == "__future__"
    )


# --- evaluating a test -----------------------------------------------------------------------


def evaluate(expression: cst.BaseExpression, facts: Facts) -> object:
    """The value of a guard's test, or UNKNOWN: literals, names of known value, `not`, `and`,
    `or`, comparisons, `x if c else y`, `torch.cuda.is_available()` (when the device is known)."""
    literal = _literal(expression)
    if literal is not UNKNOWN:
        return literal
    if isinstance(expression, cst.Name):
        if expression.value == "TYPE_CHECKING":
            return False
        return facts.values.get(expression.value, UNKNOWN)
    if isinstance(expression, cst.UnaryOperation) and isinstance(expression.operator, cst.Not):
        value = evaluate(expression.expression, facts)
        return UNKNOWN if value is UNKNOWN else not value
    if isinstance(expression, cst.BooleanOperation):
        return _boolean(expression, facts)
    if isinstance(expression, cst.Comparison) and len(expression.comparisons) == 1:
        return _compare(expression, facts)
    if isinstance(expression, cst.IfExp):
        test = evaluate(expression.test, facts)
        if test is UNKNOWN:
            return UNKNOWN
        return evaluate(expression.body if test else expression.orelse, facts)
    if (
        isinstance(expression, cst.Call)
        and not expression.args
        and facts.cuda is not None
        and code_of(expression.func) == "torch.cuda.is_available"
    ):
        return facts.cuda
    if isinstance(expression, cst.Attribute) and code_of(expression) == "typing.TYPE_CHECKING":
        return False
    return UNKNOWN


def _literal(expression: cst.BaseExpression) -> object:
    if isinstance(expression, cst.Name) and expression.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[expression.value]
    if isinstance(expression, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
        try:
            return ast.literal_eval(code_of(expression))
        except (ValueError, SyntaxError):
            return UNKNOWN
    return UNKNOWN


def _boolean(expression: cst.BooleanOperation, facts: Facts) -> object:
    left = evaluate(expression.left, facts)
    is_and = isinstance(expression.operator, cst.And)
    if left is not UNKNOWN and (not left if is_and else left):
        return left  # short-circuits: the right side is never needed
    right = evaluate(expression.right, facts)
    if left is UNKNOWN:
        # `unknown and False` is falsy, `unknown or True` truthy: enough for a branch
        if right is not UNKNOWN and (not right if is_and else right):
            return right
        return UNKNOWN
    return right


def _compare(expression: cst.Comparison, facts: Facts) -> object:
    target = expression.comparisons[0]
    left = evaluate(expression.left, facts)
    right = evaluate(target.comparator, facts)
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    operator = target.operator
    if isinstance(operator, cst.Is):
        return left is right
    if isinstance(operator, cst.IsNot):
        return left is not right
    if MODULE in (left, right):  # a module compared by value: not worked out
        return UNKNOWN
    comparisons: dict[type, Callable[[object, object], bool]] = {
        cst.Equal: lambda a, b: a == b,
        cst.NotEqual: lambda a, b: a != b,
    }
    compare = comparisons.get(type(operator))
    return UNKNOWN if compare is None else compare(left, right)
