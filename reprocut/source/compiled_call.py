"""Straight to the compiled function: candidates that call it once, with its recorded inputs.

A failure only torch.compile shows needs no training loop: the script's definitions (imports,
custom ops, functions, classes, constants), then one call of what was compiled, with tensors
rebuilt from the specs of its first call in the recording (integer values kept, so ids and
indices are the real ones). What was compiled is called through the public API as the script
did: a function decorated with `@torch.compile`, a name bound to `torch.compile(fn)` at top
level, or `torch.compile(Model())` for a module whose constructor needs no arguments. Each
candidate is only a guess until the compile-only check accepts it.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from reprocut.model.case import TensorSpec
from reprocut.source.passes.specs import spec_expression

_MAIN_GUARD = m.If(
    test=m.Comparison(left=m.Name("__name__"), comparisons=[m.ComparisonTarget(m.Equal())])
)


def compiled_call_candidates(code: str, name: str, specs: Sequence[TensorSpec | None]) -> list[str]:
    """Scripts that define what `code` defines and call the compiled `name` once."""
    if any(spec is None for spec in specs):
        return []  # a non-tensor argument: its value was not recorded
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return []
    kept = [s for s in module.body if _is_definition(s)]
    arguments = [cst.Arg(spec_expression(spec, code)) for spec in specs if spec is not None]
    callees: list[cst.BaseExpression] = []
    for statement in kept:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            if any(_mentions_compile(d.decorator) for d in statement.decorators):
                callees.append(cst.Name(name))
            else:
                callees.append(_compile_call(cst.Name(name)))
        elif isinstance(statement, cst.ClassDef) and statement.name.value == name:
            callees.append(_compile_call(cst.Call(cst.Name(name), [])))
        elif _binds_compiled(statement, name):
            target = statement.body[0].targets[0].target  # type: ignore[attr-defined]
            callees.append(target)
    candidates = []
    for callee in callees:
        call = cst.SimpleStatementLine(
            [cst.Expr(cst.Call(callee, arguments))], leading_lines=[cst.EmptyLine()] * 2
        )
        candidates.append(module.with_changes(body=[*_used(kept, call), call]).code)
    return candidates


def _used(kept: list[cst.CSTNode], call: cst.CSTNode) -> list[cst.CSTNode]:
    """`kept` without plain functions nothing calls any more (`main`, the training loop):
    decorated ones stay, their decorators may register something (a custom op's fake)."""
    while True:
        unused = [
            s
            for s in kept
            if isinstance(s, cst.FunctionDef) and not s.decorators and not _refers_to(kept, call, s)
        ]
        if not unused:
            return kept
        kept = [s for s in kept if s not in unused]


def _refers_to(kept: list[cst.CSTNode], call: cst.CSTNode, function: cst.FunctionDef) -> bool:
    """Whether anything but `function` itself names it."""
    name = function.name.value
    return any(
        m.findall(statement, m.Name(name))
        for statement in (*kept, call)
        if statement is not function
    )


def _is_definition(statement: cst.CSTNode) -> bool:
    """Imports, defs, classes and plain assignments; not the main guard or a bare call."""
    if isinstance(statement, cst.FunctionDef | cst.ClassDef):
        return True
    if m.matches(statement, _MAIN_GUARD) or not isinstance(statement, cst.SimpleStatementLine):
        return False
    return all(
        isinstance(small, cst.Import | cst.ImportFrom | cst.Assign | cst.AnnAssign)
        for small in statement.body
    )


def _mentions_compile(node: cst.CSTNode) -> bool:
    return bool(m.findall(node, m.Name("compile") | m.Attribute(attr=m.Name("compile"))))


def _compile_call(target: cst.BaseExpression) -> cst.Call:
    return cst.Call(cst.parse_expression("torch.compile"), [cst.Arg(target)])


def _binds_compiled(statement: cst.CSTNode, name: str) -> bool:
    """`fast = torch.compile(name)` (or `torch.compile(name, ...)`) at top level."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    return (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and m.matches(
            assign.value,
            m.Call(
                func=m.Attribute(attr=m.Name("compile")) | m.Name("compile"),
                args=[m.Arg(value=m.Name(name)), m.ZeroOrMore()],
            ),
        )
    )
