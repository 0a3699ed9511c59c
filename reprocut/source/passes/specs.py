"""Replace what reaches the failing call by tensors built from recorded specs (strides kept)."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from typing import Any

import libcst as cst
import libcst.matchers as m
import libcst.metadata

from reprocut.model.case import RANDOM_KINDS, Generated, Literal, TensorSpec
from reprocut.source.passes.focus_calls import focus_callee
from reprocut.source.passes.tree import (
    Enclosing,
    PassContext,
    Targeted,
    is_constant,
    parse,
    transform,
)
from reprocut.source.passes.walk import of_type

# --- replace_with_specs ----------------------------------------------------------------------

_SEED = m.SimpleStatementLine(
    [m.Expr(m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("manual_seed"))))]
)
_IMPORT_LINE = m.SimpleStatementLine([m.AtLeastN(m.Import() | m.ImportFrom(), n=1)])


def is_random(value: cst.CSTNode) -> bool:
    """A spec's tensor made by a random generator (`torch.randint(...)`, maybe viewed)."""
    return any(
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in RANDOM_KINDS
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value == "torch"
        for call in of_type(value, cst.Call)
    )


def _has_seed(module: cst.Module) -> bool:
    return any(m.matches(s, _SEED) for s in module.body)


def without_seed(module: cst.Module) -> cst.Module:
    """The module less its top-level `torch.manual_seed(...)` lines: the size order measures
    that (a seed costs a candidate nothing, so passes may add one and never gain by dropping
    one)."""
    body = [s for s in module.body if not m.matches(s, _SEED)]
    return module if len(body) == len(module.body) else module.with_changes(body=body)


def seeds_its_randomness(module: cst.Module) -> bool:
    """No torch random generator is called, or a top-level `torch.manual_seed(...)` is."""
    return not is_random(module) or _has_seed(module)


def seeded(code: str) -> str:
    """`code` with `torch.manual_seed(0)` after its imports, unless it seeds at top level
    already. A candidate whose tensors come from random generators must draw the same values in
    every run: on the H200 unseeded index tensors spanning 2**33 rows faulted with error 700 in
    the fork and 717 in the plain runs, one bug in one run and another in the next."""
    module = parse(code)
    if module is None or _has_seed(module):
        return code  # seeded already
    at = max((i + 1 for i, s in enumerate(module.body) if m.matches(s, _IMPORT_LINE)), default=0)
    seed = cst.parse_statement("torch.manual_seed(0)\n")
    return module.with_changes(body=[*module.body[:at], seed, *module.body[at:]]).code


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


def implies_float32(script: str) -> bool:
    """torch's default float dtype stays float32 in `script`: nothing there changes it."""
    return "set_default_dtype" not in script and "set_default_tensor_type" not in script


def spec_expression(spec: TensorSpec, script: str = "") -> cst.BaseExpression:
    """A tensor with the spec's shape, dtype, device, strides and storage offset, as the
    `script` it goes into reads it.

    A non-contiguous or offset spec is built as a flat storage viewed with `as_strided`, so an
    expanded (stride 0) or offset view reaches the kernel exactly as it did in the user's run.
    A dtype the constructor implies and a zero storage offset are left out: on the H200 each
    cost the reduction a check of its own to drop (6 of expand_bias' 55).
    """
    options = []
    if spec.device != "cpu":
        options.append(_kw("device", literal(spec.device)))
    plain = spec.is_contiguous and spec.storage_offset == 0
    shape: tuple[int, ...] = spec.shape if plain else (spec.storage_numel,)
    values = spec.values
    is_float = spec.dtype.startswith(("float", "bfloat", "complex"))
    kind = values.kind if isinstance(values, Generated) else ("randn" if is_float else "zeros")
    if kind in {"randn", "rand"} and not is_float:
        kind = "zeros"
    float32 = "float32" if implies_float32(script) else None
    if isinstance(values, Literal) and len(values.values) == (spec.numel if plain else -1):
        implied = _literal_dtype(values.values, float32)
        base = cst.Call(
            cst.parse_expression("torch.tensor"),
            [cst.Arg(literal(tuple(values.values))), *_with_dtype(options, spec, implied)],
        )
        built = cst.Call(cst.Attribute(base, cst.Name("reshape")), [cst.Arg(literal(spec.shape))])
    elif kind == "randint":
        assert isinstance(values, Generated)
        args = [literal(values.low), literal(values.high), literal(shape)]
        options = _with_dtype(options, spec, "int64")
        built = cst.Call(cst.parse_expression("torch.randint"), [*map(cst.Arg, args), *options])
    elif kind == "full":  # the fill value's type would pick the dtype: always name it
        assert isinstance(values, Generated)
        args = [literal(shape), literal(values.low)]
        options = _with_dtype(options, spec, None)
        built = cst.Call(cst.parse_expression("torch.full"), [*map(cst.Arg, args), *options])
    else:
        name = kind if kind in {"randn", "rand", "zeros", "ones"} else "zeros"
        options = _with_dtype(options, spec, float32)
        built = cst.Call(cst.parse_expression(f"torch.{name}"), [cst.Arg(literal(shape)), *options])
    if not plain:
        stride = spec.stride if spec.stride is not None else _contiguous(spec.shape)
        view = [cst.Arg(literal(spec.shape)), cst.Arg(literal(tuple(stride)))]
        if spec.storage_offset:
            view.append(cst.Arg(literal(spec.storage_offset)))
        built = cst.Call(cst.Attribute(built, cst.Name("as_strided")), view)
    return built


def _with_dtype(options: list[cst.Arg], spec: TensorSpec, implied: str | None) -> list[cst.Arg]:
    """`options` led by `dtype=` unless the constructor gives `spec`'s dtype by itself."""
    if spec.dtype == implied:
        return options
    return [_kw("dtype", cst.parse_expression(f"torch.{spec.dtype}")), *options]


def _literal_dtype(values: Sequence[Any], float32: str | None) -> str | None:
    """The dtype `torch.tensor(values)` picks by itself (None: not known to be float32)."""
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int64"
    return float32


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, running = [], 1
    for size in reversed(shape):
        stride.append(running)
        running *= max(size, 1)
    return tuple(reversed(stride))


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
    """Arguments of the focus call (none while the code does not make it yet, e.g. before its
    module is inlined); of every call when there is no focus at all."""
    visitor = _SpecSites(module, focus_callee(focus))
    module.visit(visitor)
    return visitor.found


class _ReplaceArg(Targeted):
    def __init__(self, target: cst.Arg, value: cst.BaseExpression) -> None:
        super().__init__()
        self.target, self.value = target, value

    def targets(self) -> Iterable[int]:
        return (id(self.target),)

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


def _spec_candidate(
    code: str, module: cst.Module, arg: cst.Arg, value: cst.BaseExpression
) -> str | None:
    """A Name argument is replaced wherever its function reads it (so what computed it can
    go, `n = x.numel()` included); any other argument only where it is."""
    if isinstance(arg.value, cst.Name):
        enclosing = Enclosing(arg)
        module.visit(enclosing)
        scope = enclosing.found if enclosing.found is not None else module
        return _replace_name(code, module, scope, arg.value.value, value)
    return transform(code, _ReplaceArg(arg, value), module)


def focus_scope(module: cst.Module, focus: str | None) -> cst.CSTNode | None:
    """The function that makes the failing call (the module when it is made at top level)."""
    callee = focus_callee(focus)
    if callee is None:
        return None
    for call in m.findall(module, m.Call()):
        if module.code_for_node(call.func) == callee:  # type: ignore[attr-defined]
            enclosing = Enclosing(call)
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


def replace_with_specs(code: str, context: PassContext) -> Generator[Any, Any, None]:
    """Replace what reaches the failing call by tensors built from recorded specs, so what
    computed it (model, data pipeline) can go: first the tensor parameters of the function
    making the call, then the call's arguments (the spec at the argument's position first)."""
    for name, spec in context.named_specs:
        module = parse(code)
        scope = None if module is None else focus_scope(module, context.focus)
        if module is None or scope is None:
            break
        value = spec_expression(spec, code)
        candidate = _replace_name(code, module, scope, name, value)
        if candidate is not None and _bound_to(module, name, value):
            candidate = without_dead_binding(candidate, name)  # else: a second tensor, no more
        if candidate is not None and is_random(value):
            candidate = seeded(candidate)
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
            value = spec_expression(spec, code)
            candidate = _spec_candidate(code, module, arg, value)
            if isinstance(arg.value, cst.Name) and _bound_to(module, arg.value.value, value):
                candidate = candidate and without_dead_binding(candidate, arg.value.value)
            if candidate is not None and is_random(value):
                candidate = seeded(candidate)
            if candidate is not None and (yield candidate):
                code, accepted = candidate, True
                break
        if not accepted:
            i += 1  # an accepted site became a constant: it is no longer in the list


def without_dead_binding(code: str, name: str) -> str | None:
    """`code` less its module-level `name = ...` lines, when nothing reads `name` any more
    (None: something does). Replacing a name bound to its spec already (a jump binds each
    tensor so) by the spec adds a second tensor; it shortens the repro only with the binding
    gone, in the same candidate: one check for the line, not two."""
    module = parse(code)
    if module is None:
        return None
    wrapper = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(cst.metadata.ScopeProvider)
    scope = scopes.get(module)
    if scope is None or name not in scope or any(a.references for a in scope[name]):
        return None
    dead = [
        s for s in module.body
        if m.matches(s, m.SimpleStatementLine([m.Assign([m.AssignTarget(m.Name(name))])]))
    ]  # fmt: skip
    if not dead or len(dead) != len(scope[name]):
        return None  # bound some other way too (an import, a loop, a def)
    return module.with_changes(body=[s for s in module.body if s not in dead]).code


def _bound_to(module: cst.Module, name: str, value: cst.BaseExpression) -> bool:
    """`name = value` is a statement of the module (at any depth)."""
    wanted = module.code_for_node(value)
    return any(
        len(node.targets) == 1
        and m.matches(node.targets[0].target, m.Name(name))
        and module.code_for_node(node.value) == wanted
        for node in m.findall(module, m.Assign())
    )
