"""Expression-level passes: simpler values, sub-expressions, smaller integers, fewer arguments."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from functools import lru_cache
from typing import Any

import libcst as cst
import libcst.matchers as m

from reprocut.source.integer_search import first_integers, searches_below, smaller_integers
from reprocut.source.passes.focus_calls import focus_calls
from reprocut.source.passes.launches import configuration_integers
from reprocut.source.passes.tree import (
    Options,
    PassContext,
    Targeted,
    alias_name,
    count_statements,
    is_constant,
    parse,
    statement_site,
    sweep,
    transform,
    variable_counts,
)
from reprocut.source.passes.walk import of_type

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


class _SetInteger(Targeted):
    def __init__(self, target: cst.Integer, value: int) -> None:
        super().__init__()
        self.target, self.value = target, value

    def targets(self) -> Iterable[int]:
        return (id(self.target),)

    def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> Any:
        return cst.Integer(str(self.value)) if original_node is self.target else updated_node


def integer_value(node: cst.Integer) -> int:
    return int(node.value.replace("_", ""), 0)


def shrink_integers(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Make integer constants (epochs, batch and hidden sizes) small: 0, half and the round
    value below (`first_integers`), then, once one was accepted, the span below it searched
    in rounds of round values (reprocut.source.integer_search); those a kernel launch's grid
    or block is made of no smaller than 1 (a launch of 0 blocks or threads is an invalid
    configuration, not a smaller repro)."""
    module = parse(code)
    if module is None:
        return
    i = len(integers_of(module)) - 1
    lows: dict[int, int] = {}  # per integer: the largest value known not to fail
    searching: set[int] = set()  # integers a smaller value was accepted for: a span to search
    while i >= 0:
        accepted = yield Options(_smaller_integers_from(code, i, lows, searching, context))
        if accepted is None:
            return
        (i, low, search), code = accepted  # stay at that integer: the new value may shrink further
        lows[i] = low
        if search:
            searching.add(i)


def _smaller_integers_from(
    code: str, last: int, lows: dict[int, int], searching: set[int], context: PassContext
) -> Iterator[tuple[tuple[int, int, bool], str | None]]:
    module = parse(code)
    if module is None:
        return
    found = integers_of(module)
    configuring = configuration_integers(module)
    for i in range(min(last, len(found) - 1), -1, -1):
        low = max(lows.get(i, -1), 0 if id(found[i]) in configuring else -1)
        value = integer_value(found[i])
        if i in searching:
            values = smaller_integers(value, low, context.ways)
        else:
            values = first_integers(value, low)
        for new in values:
            search = i in searching or searches_below(value, new)
            yield (i, low, search), transform(code, _SetInteger(found[i], new), module)
            low = new  # offered after this one only if this one was rejected


# --- drop_arguments --------------------------------------------------------------------------


def droppable_arguments(code: str) -> list[cst.Arg]:
    """Keyword arguments and last positional arguments of calls, in source order: ones a
    default may replace."""
    module = parse(code)
    return [] if module is None else list(_droppable(module))


@lru_cache(maxsize=8)
def _droppable(module: cst.Module) -> list[cst.Arg]:
    """`droppable_arguments` of a module (asked once per site of a sweep: shared, read only)."""
    found: list[cst.Arg] = []
    for call in of_type(module, cst.Call):
        if any(arg.star for arg in call.args):
            continue
        positional = [a for a in call.args if a.keyword is None]
        found += [a for a in call.args if a.keyword is not None or a is positional[-1]]
    return found


class _DropArg(Targeted):
    def __init__(self, target: cst.Arg) -> None:
        super().__init__()
        self.target = target

    def targets(self) -> Iterable[int]:
        return (id(self.target),)

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


def drop_arguments(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Leave out keyword and trailing arguments, so their defaults apply."""

    def apply_at(code: str, index: int) -> str | None:
        module = parse(code)
        found = [] if module is None else _droppable(module)
        if index >= len(found):
            return None
        return transform(code, _DropArg(found[index]), module)

    yield from sweep(code, lambda c: len(droppable_arguments(c)), apply_at)


# --- simplify_expressions ------------------------------------------------------------------

SIMPLE_VALUES = ("0", "None")


class _ValueSites(cst.CSTVisitor):
    """Right-hand sides of assignments and call arguments that are not constants already,
    outside the `kept` calls and the assignments to `kept_names`."""

    def __init__(self, kept: list[cst.Call], kept_names: set[str]) -> None:
        self.found: list[cst.BaseExpression] = []
        self.kept, self.kept_names = kept, kept_names

    def _add(self, value: cst.BaseExpression) -> None:
        if not is_constant(value) and not isinstance(value, cst.Lambda):
            self.found.append(value)

    def visit_Assign(self, node: cst.Assign) -> bool:
        if any(variable_counts(t.target).keys() & self.kept_names for t in node.targets):
            return False
        self._add(node.value)
        return True

    def visit_Call(self, node: cst.Call) -> bool:
        return not any(node is call for call in self.kept)

    def visit_Arg(self, node: cst.Arg) -> None:
        if not node.star:
            self._add(node.value)


def names_reaching(module: cst.Module, calls: list[cst.Call]) -> set[str]:
    """Variables the calls read, directly or through the assignments that compute them
    (by name, whatever the scope: it may say too much, never too little): their arguments,
    what they call (`_KERNEL = cupy.RawKernel(_SOURCE, ...)`: the kernel itself) and a
    launch's grid (`kernel[grid](...)`; a CuPy launch's is an argument)."""
    parts: list[cst.CSTNode] = [part for call in calls for part in (*call.args, call.func)]
    reached = {name for part in parts for name in variable_counts(part)}
    if not reached:
        return reached
    flows = [
        (
            {name for t in a.targets for name in variable_counts(t.target)},
            set(variable_counts(a.value)),
        )
        for a in of_type(module, cst.Assign)
    ]
    grown = True
    while grown:
        grown = False
        for targets, values in flows:
            if targets & reached and not values <= reached:
                reached |= values
                grown = True
    return reached


class _ReplaceExpression(Targeted):
    def __init__(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        super().__init__()
        self.target, self.value = target, value

    def targets(self) -> Iterable[int]:
        return (id(self.target),)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        return self.value if original_node is self.target else updated_node


def simplify_expressions(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Replace a computed value (an assignment's right side, an argument) by `0` or `None`.

    Not, in a memory fault, what reaches the failing call: with `out = torch.empty_like(x)`
    made `out = 0` a kernel still faults, writing past a one-element buffer instead of
    reading past the stride-0 view the user's script gave it (seen on the H200)."""
    i = 0
    while True:
        accepted = yield Options(_simplifications_from(code, i, context))
        if accepted is None:
            return
        i, code = accepted
        i += 1


def _simplifications_from(
    code: str, first: int, context: PassContext
) -> Iterator[tuple[int, str | None]]:
    module = parse(code)
    if module is None:
        return
    kept = focus_calls(module, context.focus) if context.memory_fault else []
    visitor = _ValueSites(kept, names_reaching(module, kept))
    module.visit(visitor)
    for i in range(first, len(visitor.found)):
        for text in SIMPLE_VALUES:
            replacement = cst.parse_expression(text)
            yield i, transform(code, _ReplaceExpression(visitor.found[i], replacement), module)


# --- hoist_subexpressions -------------------------------------------------------------------


def imported_modules(module: cst.Module) -> frozenset[str]:
    """The names `import x` and `import x.y as z` bind, anywhere in the module: modules."""
    return frozenset(
        alias_name(alias, first=True)
        for node in of_type(module, cst.Import)
        for alias in node.names
    )


# a tensor's methods whose value is a Python int (`size` and `stride` given a dim): the tensor
# never stands in for it. In the faults calls' logs, all 36 such hoists (`ids.numel()` -> `ids`)
# and all 13 of a shape's item to the shape (`t.shape[1]` -> `t.shape`) failed otherwise.
_INT_METHODS = frozenset({"numel", "nelement", "dim", "ndimension", "element_size", "data_ptr",
                          "storage_offset", "get_device"})  # fmt: skip
_INT_GIVEN_A_DIM = frozenset({"size", "stride"})


def _children(node: cst.CSTNode, modules: frozenset[str] = frozenset()) -> list[cst.BaseExpression]:
    """Sub-expressions that may stand in for a node: `a.m(x)` -> `a`, `a[i]` -> `a`, ...; not
    a module (`torch.randn(4)` -> `torch`, `np.int32(n)` -> `np`: `modules`, the names its
    imports bind), which no call takes for a value: where the value goes unused, deleting the
    statement is the same cut. Not a tensor for the int a method of it gives, nor a shape for
    its item (`_INT_METHODS`)."""
    if isinstance(node, cst.Call):
        options = [a.value for a in node.args if a.keyword is None and not a.star][:1]
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and not (isinstance(func.value, cst.Name) and func.value.value in modules)
            and not _gives_an_int(func.attr.value, node)
        ):
            options.insert(0, func.value)
        return options
    if isinstance(node, cst.Subscript):
        return [] if _is_a_shape(node.value) else [node.value]
    if isinstance(node, cst.BinaryOperation | cst.BooleanOperation):
        return [node.left, node.right]
    if isinstance(node, cst.Comparison):
        return [node.left]
    if isinstance(node, cst.UnaryOperation):
        return [node.expression]
    return []


def _gives_an_int(method: str, call: cst.Call) -> bool:
    return method in _INT_METHODS or (method in _INT_GIVEN_A_DIM and bool(call.args))


def _is_a_shape(node: cst.BaseExpression) -> bool:
    """`t.shape`, `t.size()`, `t.stride()`: indexed, an int."""
    if isinstance(node, cst.Attribute):
        return node.attr.value == "shape"
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in _INT_GIVEN_A_DIM
        and not node.args
    )


class _HoistSites(cst.CSTVisitor):
    def __init__(self, modules: frozenset[str]) -> None:
        self.found: list[cst.BaseExpression] = []
        self.modules = modules

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseExpression) and is_constant(node):
            return False
        if _children(node, self.modules):
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


def hoist_subexpressions(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Replace an expression by one of its parts (`(model(x).argmax() == y).sum()` -> `model(x)`)
    and an assignment whose name is not needed by its value."""
    code = yield from sweep(
        code,
        count_statements,
        lambda code, i: statement_site(code, i, lambda _, s: _value_statement(s)),
    )
    i = 0
    while True:
        accepted = yield Options(_hoists_from(code, i))
        if accepted is None:
            return
        i, code = accepted  # stay at that site: its new value may hoist further


def _hoists_from(code: str, first: int) -> Iterator[tuple[int, str | None]]:
    module = parse(code)
    if module is None:
        return
    modules = imported_modules(module)
    visitor = _HoistSites(modules)
    module.visit(visitor)
    discarded = {id(n.value) for n in of_type(module, cst.Expr)}  # values of statements
    for i in range(first, len(visitor.found)):
        site = visitor.found[i]
        for child in _with_innermost(_children(site, modules), modules):
            if id(site) in discarded and _is_dotted(child):
                continue  # `torch.cuda.synchronize()` -> `torch.cuda`: a statement that does
                # nothing, as deleting it does (delete_statements' candidate, checked already)
            yield i, transform(code, _ReplaceExpression(site, child), module)


def _with_innermost(
    children: list[cst.BaseExpression], modules: frozenset[str]
) -> list[cst.BaseExpression]:
    """`children`, led by the innermost operand of arithmetic on the first one, where that is
    deeper: `(n + 256 - 1) // 256` -> `n` first, then `n + 256 - 1`. Stepping down one level a
    check, it took contiguous_pe's reduction on the H200 four accepted checks in a row. Only
    through arithmetic: through calls (`next(iter(rows))` -> `rows`) the CPU helper_error case
    jumped to a repro a line longer than the steps found."""
    if not children:
        return children
    inner, depth = children[0], 0
    while isinstance(inner, cst.BinaryOperation | cst.UnaryOperation):
        inner, depth = _children(inner, modules)[0], depth + 1
    return [inner, *children] if depth else children


def _is_dotted(node: cst.BaseExpression) -> bool:
    """A name or an attribute of one (`torch.cuda`): reading it does nothing."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)
