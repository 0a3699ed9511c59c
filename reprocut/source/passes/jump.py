"""Cut straight to the failing call: one candidate that skips the whole training run.

The fine passes get there one statement at a time, each check re-running the user's training up
to the failing step (minutes on a GPU). When the tensors reaching the function that makes the
failing call were probed, a script made of the module's definitions, those tensors bound to the
function's parameters and the function's body up to the call often fails the same way at once.
If it does not, one check is lost and the fine passes carry on from the original.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import libcst as cst
import libcst.matchers as m

from reprocut.source.passes.focus_calls import focus_callee, focus_calls
from reprocut.source.passes.inlining import inline_all
from reprocut.source.passes.specs import focus_scope, is_random, literal, seeded, spec_expression
from reprocut.source.passes.statements import unused_definitions
from reprocut.source.passes.tree import (
    PassContext,
    body_statements,
    compiles,
    is_constant,
    parse,
)

_MAIN_GUARD = m.If(
    test=m.Comparison(left=m.Name("__name__"), comparisons=[m.ComparisonTarget(m.Equal())])
)


def jump_to_call(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """The definitions, the probed tensors as the failing function's parameters, and its body up
    to the failing call; first with what nothing refers to any more dropped, then as it is; in
    each, the parameters first made where they are first used, then all before the body. Last,
    the definitions and the failing call alone, made on the probed tensors (`_call_alone`)."""
    if not (context.named_specs or context.specs):
        return
    module = parse(code)
    if module is None:
        return
    function = focus_scope(module, context.focus)
    if not isinstance(function, cst.FunctionDef):
        return  # the call is made at top level already
    defined = _defined_names(module)
    kept = [s for s in module.body if _is_set_up(s, defined)]
    tried: set[str] = set()
    body = _body_up_to_call(module, function, focus_callee(context.focus))
    if body is not None and context.named_specs:
        bindings = _parameter_bindings(function, context, code)
        eager = [*(b for _, b in bindings), *body]
        pruned = _without_unused(module, kept, eager)
        runs = [_bound_before_use(bindings, body), eager]
        for set_up in (pruned, kept) if len(pruned) < len(kept) else (kept,):
            for run in runs:
                candidate = _compiled(module.with_changes(body=[*set_up, *run]))
                if candidate is not None and any(is_random(b) for _, b in bindings):
                    candidate = seeded(candidate)
                if candidate is None or candidate in tried:
                    continue
                tried.add(candidate)
                if (yield candidate):
                    return
    alone = _call_alone(module, context, code)
    if alone is not None:
        set_up = _without_unused(module, kept, alone)
        candidate = _compiled(module.with_changes(body=[*set_up, *alone]))
        if candidate is not None and candidate not in tried:
            yield seeded(candidate) if any(is_random(s) for s in alone) else candidate


def _call_alone(
    module: cst.Module, context: PassContext, code: str
) -> list[cst.BaseStatement] | None:
    """The failing call as a statement of its own, each tensor argument the one probed there,
    each other argument the constant it was or the value probed (bound to its name first when
    it is a name: `n = 4096`, and `grid = (4,)` for a launch's computed grid): the jump where
    the function making the call cannot be called on what reached it (a model's `forward`,
    whose `self` no probe makes). None when an argument is neither, or they are unpacked."""
    calls = focus_calls(module, context.focus)
    if not calls or not context.specs:
        return None
    call = calls[0]
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or len(positional) != len(context.specs):
        return None
    values = context.call_args
    if len(values) != len(positional):
        values = (None,) * len(positional)
    keywords = dict(context.call_keywords)
    bound: dict[str, cst.BaseExpression] = {}
    args = []
    given = iter(zip(context.specs, values, strict=True))  # the positional ones, in order
    for arg in call.args:
        if arg.keyword is None:
            spec, value = next(given)
            made = (
                spec_expression(spec, code) if spec is not None else _plain(arg.value, value, bound)
            )
        else:
            made = _plain(arg.value, keywords.get(arg.keyword.value), bound)
        if made is None:
            return None
        args.append(arg.with_changes(value=made))
    func = call.func
    if isinstance(func, cst.Subscript) and len(func.slice) == 1:
        element = func.slice[0]
        if not isinstance(element.slice, cst.Index):
            return None
        grid = _plain(element.slice.value, context.call_grid, bound, name="grid")
        if grid is None:
            return None
        func = func.with_changes(slice=[element.with_changes(slice=cst.Index(grid))])
    made_first = [
        cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)])
        for name, value in bound.items()
    ]
    alone = cst.SimpleStatementLine([cst.Expr(call.with_changes(func=func, args=args))])
    return [*made_first, alone]


def _plain(
    expression: cst.BaseExpression, value: Any, bound: dict[str, cst.BaseExpression],
    name: str | None = None,
) -> cst.BaseExpression | None:  # fmt: skip
    """A call's plain argument: a constant as it is; else its probed value, bound to the name
    it was read from (or to `name`) first, so that a launch's grid stays a name (the validity
    rules leave a named grid to the sanitizer), or in its place. None: no value was probed."""
    if is_constant(expression):
        return expression
    if value is None:
        return None
    target = expression.value if isinstance(expression, cst.Name) else name
    if target is None:
        return literal(value)
    bound[target] = literal(value)
    return cst.Name(target)


def jump_ahead(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """The jump, made from the script with all its modules pasted in, before they are pasted in
    one check at a time: when the failing call is in a sibling module (a kernel's wrapper in
    kernels.py), the pasted script's check runs the whole training again (16 s on the H200 for
    a CuPy case, before the jump's 0.6 s one). If no jump reproduces, inlining goes on as before
    and the same jump is not checked twice (the reducer skips texts it has seen)."""
    if not context.named_specs:
        return
    inlined = inline_all(code, context.search_dirs)
    if inlined != code:
        yield from jump_to_call(inlined, context)


def _bound_before_use(
    bindings: list[tuple[str, cst.SimpleStatementLine]], body: list[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """Each parameter made just before the first statement that uses it (unused ones first).

    The order of allocations decides what an out-of-bounds read lands in: a 4 MB expanded
    tensor read as 1 GB faults when it was the last thing allocated, and reads the next tensor
    harmlessly when `out = torch.empty_like(x)` came after it, as it does when every parameter
    is made before the body."""
    waiting = dict(bindings)
    run: list[cst.BaseStatement] = []
    for statement in body:
        names = {n.value for n in m.findall(statement, m.Name())}  # type: ignore[union-attr]
        for name in [name for name in waiting if name in names]:
            run.append(waiting.pop(name))
        run.append(statement)
    return [*waiting.values(), *run]  # what no statement uses, first


def _compiled(module: cst.Module) -> str | None:
    try:
        code = module.code
    except (cst.CSTValidationError, ValueError, TypeError):
        return None
    return code if compiles(code) else None


def _without_unused(
    module: cst.Module, set_up: list[cst.BaseStatement], run: list[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """The set-up without definitions nothing refers to, until none is left (`main` first,
    then the model it built, then the layers the model used)."""
    while True:
        unused = {id(s) for s in unused_definitions(module.with_changes(body=[*set_up, *run]))}
        kept = [s for s in set_up if id(s) not in unused]
        if len(kept) == len(set_up):
            return kept
        set_up = kept


def _is_set_up(statement: cst.BaseStatement, defined: set[str]) -> bool:
    """What a script sets up rather than runs: imports, definitions, assignments and calls such
    as `sys.path.insert(...)`; not a call of the script's own functions (`main()`), the
    `__main__` guard or a top-level loop: those are the run being skipped."""
    if isinstance(statement, cst.FunctionDef | cst.ClassDef):
        return True
    if isinstance(statement, cst.SimpleStatementLine):
        return not any(
            isinstance(s, cst.Expr) and _calls_one_of(s.value, defined) for s in statement.body
        )
    if isinstance(statement, cst.Try):  # `try: import x / except ImportError: ...`
        return all(_is_set_up(s, defined) for s in body_statements(statement.body))
    return isinstance(statement, cst.If) and not m.matches(statement, _MAIN_GUARD)


def _calls_one_of(expression: cst.BaseExpression, names: set[str]) -> bool:
    return isinstance(expression, cst.Call) and m.matches(
        expression.func, m.Name(m.MatchIfTrue(lambda name: name in names))
    )


def _defined_names(module: cst.Module) -> set[str]:
    return {s.name.value for s in module.body if isinstance(s, cst.FunctionDef | cst.ClassDef)}


def _body_up_to_call(
    module: cst.Module, function: cst.FunctionDef, callee: str | None
) -> list[cst.BaseStatement] | None:
    """The function's statements up to the one making the failing call, returns made plain."""
    statements = body_statements(function.body)
    for index, statement in enumerate(statements):
        calls = m.findall(statement, m.Call())
        if any(module.code_for_node(c.func) == callee for c in calls):  # type: ignore[attr-defined]
            prefix = statements[: index + 1]
            return [s.visit(_PlainReturns()) for s in prefix]  # type: ignore[misc]
    return None


class _PlainReturns(cst.CSTTransformer):
    """`return x` -> `x` and a bare `return` -> `pass` (not inside nested definitions)."""

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> Any:
        if updated_node.value is None:
            return cst.Pass()
        return cst.Expr(updated_node.value)


def _parameter_bindings(
    function: cst.FunctionDef, context: PassContext, code: str
) -> list[tuple[str, cst.SimpleStatementLine]]:
    """`name = <tensor>` for probed tensor parameters, `name = <value>` for probed plain ones,
    `name = <default>` for the others that have a default; a parameter with none of these stays
    unbound (a candidate using it fails)."""
    specs = dict(context.named_specs)
    values = dict(context.named_values)
    params: Sequence[cst.Param] = (
        *function.params.posonly_params,
        *function.params.params,
        *function.params.kwonly_params,
    )
    bindings = []
    for param in params:
        name = param.name.value
        if name in specs:
            value: cst.BaseExpression | None = spec_expression(specs[name], code)
        elif name in values:
            value = literal(values[name])
        else:
            value = param.default
        if value is not None:
            target = cst.AssignTarget(cst.Name(name))
            bindings.append((name, cst.SimpleStatementLine(body=[cst.Assign([target], value)])))
    return bindings
