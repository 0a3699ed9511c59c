"""Candidates that raise before they reach the failing call, seen without running them.

On the H200 a candidate of a CuPy memory-fault script costs a CUDA context (0.24 s alone, 3 s
with sixteen checks starting theirs at once), and of the 174 checks of one fixed-point
reduction, 62 ended in a NameError (a deleted `out = ...` whose `out` the launch still reads)
and 45 in a TypeError that the call's own signature decides: `torch.randn()` without a size,
`cupy.asarray()` without an array, a CuPy launch handed a torch tensor or the `cupy` module
where its array was. Such a candidate cannot reproduce: it raises before the failing call runs.
This reads the flat script the jump to the failing call leaves (top-level statements, the
failing call among them) and names what would raise first; the validity rules
(reprocut.source.validity) reject a candidate for a problem its best does not have.

Only what certainly raises is named: a name read by a top-level simple statement before the
failing call's statement (or by the failing call's own callee and arguments) and bound by no
statement before it; a factory call missing a positional argument it requires; a CuPy launch
argument the best wrapped in `cupy.asarray(...)` that the candidate no longer wraps. Anything that
could bind names unseen (`global`, star imports, `exec`, `globals()`) turns the name rule off;
compound statements (loops, branches, `with`, definitions) count as binding every name in them.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence

import libcst as cst

from reprocut.source.passes.launches import launches
from reprocut.source.passes.tree import dotted, focus_calls
from reprocut.source.passes.walk import all_nodes, child_nodes, walk

# module globals every script has besides the builtins
_MODULE_NAMES = frozenset({
    "__name__", "__file__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__",
    "__annotations__", "__cached__",
})  # fmt: skip
_ALWAYS_BOUND = frozenset(dir(builtins)) | _MODULE_NAMES
# names through which a script can bind globals that no statement shows
_DYNAMIC = frozenset({"globals", "exec", "eval", "vars", "locals", "setattr", "__import__"})
_SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)

# factories and the positional arguments they require (`size=` and the like count as one)
REQUIRED_ARGUMENTS = {
    "torch.randn": 1, "torch.rand": 1, "torch.zeros": 1, "torch.ones": 1, "torch.empty": 1,
    "torch.full": 2, "torch.randint": 2, "torch.tensor": 1, "torch.as_tensor": 1,
    "torch.arange": 1, "torch.as_strided": 3, "torch.from_numpy": 1,
    "cupy.asarray": 1, "cp.asarray": 1, "cupy.from_dlpack": 1, "cp.from_dlpack": 1,
    "np.asarray": 1, "numpy.asarray": 1, "cupy.RawKernel": 2, "cp.RawKernel": 2,
}  # fmt: skip
# keywords that are not what a factory makes (its size, its values)
OPTIONS = frozenset({
    "device", "dtype", "layout", "requires_grad", "pin_memory", "generator", "out",
    "memory_format", "names", "options", "backend", "jitify", "enable_cooperative_groups",
})  # fmt: skip
# methods of a tensor and the positional arguments they require
REQUIRED_METHOD_ARGUMENTS = {"as_strided": 2, "expand": 1, "view": 1, "reshape": 1}
_MODULES = ("torch.", "cupy.", "cp.", "np.", "numpy.", "triton.")
# the wrappers that make a CuPy array of a tensor
ARRAY_WRAPPERS = frozenset({"cupy.asarray", "cp.asarray", "cupy.from_dlpack", "cp.from_dlpack"})
_EMPTY = cst.Module([])


def raises_before_the_call(module: cst.Module, focus: str | None) -> list[str]:
    """Why `module` raises before its failing call (empty: it may reach it)."""
    return [*unbound_names(module, focus), *missing_arguments(module), *unbound_in_kernels(module)]


def unbound_in_kernels(module: cst.Module) -> list[str]:
    """`NameError: x in kernel k` for each name a Triton kernel's body reads that neither its
    parameters, its own statements nor the module bind. A `@triton.jit` function is compiled
    at its launch, the failing call, which then raises a compile error instead of the fault: a
    deleted `pid = tl.program_id(0)` whose `pid` the offsets still read."""
    if _binds_unseen(module):
        return []
    kernels = [
        node for node in all_nodes(module)
        if isinstance(node, cst.FunctionDef) and any(_is_jit(d) for d in node.decorators)
    ]  # fmt: skip
    if not kernels:
        return []
    known = _ALWAYS_BOUND | _bound_in(module.body)
    found = []
    for kernel in kernels:
        params = kernel.params
        local = {p.name.value for p in (*params.posonly_params, *params.params,
                                         *params.kwonly_params)}  # fmt: skip
        local |= {p.name.value for p in (params.star_arg, params.star_kwarg)
                  if isinstance(p, cst.Param)}  # fmt: skip
        body = kernel.body.body
        bound = known | local | _bound_in(body)
        found += [
            f"NameError: {name} in kernel {kernel.name.value}"
            for statement in body
            for name in _reads(statement)
            if name not in bound
        ]
    return list(dict.fromkeys(found))


def _is_jit(decorator: cst.Decorator) -> bool:
    """`@triton.jit`, `@jit` (from triton), or either called with options."""
    expression = decorator.decorator
    if isinstance(expression, cst.Call):
        expression = expression.func
    return dotted(expression) in ("triton.jit", "jit")


def _bound_in(statements: Sequence[cst.CSTNode]) -> set[str]:
    """Every name the statements bind, in their blocks too (`if`, `try`, `for`, `with`):
    assignments, imports, loop and `with` targets, handlers' names, definitions' names; not
    what the bodies of the functions and classes they define bind."""
    names: set[str] = set()
    for statement in statements:
        if isinstance(statement, cst.SimpleStatementLine):
            names |= _binds(statement)
            names |= {n.target.value for n in walk(statement)
                      if isinstance(n, cst.NamedExpr) and isinstance(n.target, cst.Name)}  # fmt: skip
            continue
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            names.add(statement.name.value)
            continue
        if isinstance(statement, cst.For):
            names |= _target_names(statement.target)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None:
                    names |= _target_names(item.asname.name)
        elif isinstance(statement, cst.ExceptHandler) and statement.name is not None:
            names |= _target_names(statement.name.name)
        names |= _bound_in(
            [c for c in child_nodes(statement) if not isinstance(c, cst.BaseExpression)]
        )
    return names


def unbound_names(module: cst.Module, focus: str | None) -> list[str]:
    """`NameError: x` for each name read before any statement binds it, up to the failing
    call, and `TypeError` when the failing call's callee is bound to a module or a literal
    (a hoisted kernel source, `_KERNEL = cupy`); nothing when the call is not made at top
    level or names may be bound unseen."""
    calls = focus_calls(module, focus)
    if not calls or _binds_unseen(module):
        return []
    inside = {id(node) for call in calls for node in walk(call)}
    bound = set(_ALWAYS_BOUND)
    kinds: dict[str, str] = {}  # what each name was last bound to: "module", "literal", ""
    found = []
    for statement in module.body:
        holds_call = any(id(node) in inside for node in walk(statement))
        if holds_call:
            if isinstance(statement, cst.SimpleStatementLine):
                call = next(c for c in calls if any(n is c for n in walk(statement)))
                found += [f"NameError: {n}" for n in _reads(call) if n not in bound]
                if isinstance(call.func, cst.Name) and kinds.get(call.func.value):
                    found.append(f"TypeError: {call.func.value} is a {kinds[call.func.value]}")
            break
        if isinstance(statement, cst.SimpleStatementLine) and not any(
            isinstance(node, cst.NamedExpr) for node in walk(statement)
        ):
            found += [f"NameError: {n}" for n in _reads(statement) if n not in bound]
            bound |= _binds(statement)
            kinds.update(_bound_kinds(statement, kinds))
        else:  # a block, a definition: every name in it may be bound by it, to anything
            names = {node.value for node in walk(statement) if isinstance(node, cst.Name)}
            bound |= names
            kinds.update(dict.fromkeys(names, ""))
    return list(dict.fromkeys(found))


_LITERALS = (
    cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.Integer, cst.Float,
    cst.Imaginary, cst.Tuple, cst.List, cst.Dict, cst.Set,
)  # fmt: skip


def _bound_kinds(statement: cst.SimpleStatementLine, kinds: dict[str, str]) -> dict[str, str]:
    """The names this statement binds, each to "module" (`import x`, `k = x` for such an x),
    "literal" (`k = "..."`, `k = None`) or "" (anything else)."""
    found = dict.fromkeys(_binds(statement), "")
    for small in statement.body:
        if isinstance(small, cst.Import):
            found.update({_alias_name(a, first=True): "module" for a in small.names})
        elif isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value = small.targets[0].target, small.value
            if not isinstance(target, cst.Name):
                continue
            if isinstance(value, _LITERALS) or (
                isinstance(value, cst.Name) and value.value in ("None", "True", "False")
            ):
                found[target.value] = "literal"
            elif isinstance(value, cst.Name) and kinds.get(value.value) == "module":
                found[target.value] = "module"
    return found


def missing_arguments(module: cst.Module) -> list[str]:
    """`TypeError: f() needs n` for each factory call with fewer arguments than it requires
    (`torch.randn(size=(2,))` has its size; `torch.randn(device="cuda")` has none)."""
    found = []
    for call in (n for n in all_nodes(module) if isinstance(n, cst.Call)):
        needed = _required(call.func)
        if needed is None or any(a.star for a in call.args):
            continue
        given = [a for a in call.args if a.keyword is None or a.keyword.value not in OPTIONS]
        if len(given) >= needed:
            continue
        shown = dotted(call.func) or _EMPTY.code_for_node(call.func)
        found.append(f"TypeError: {shown}() without its {needed} argument(s)")
    return found


def _required(func: cst.BaseExpression) -> int | None:
    """The positional arguments a factory (`torch.randn`) or a tensor method (`x.view`)
    requires; None for any other callee."""
    name = dotted(func)
    if name in REQUIRED_ARGUMENTS:
        return REQUIRED_ARGUMENTS[name]
    if not isinstance(func, cst.Attribute):
        return None
    if name is not None and name.startswith(_MODULES):  # `torch.view`: not a tensor's method
        return None
    return REQUIRED_METHOD_ARGUMENTS.get(func.attr.value)


def unwrapped_arrays(candidate: cst.Module, best: cst.Module) -> list[str]:
    """CuPy launch arguments the best wraps in `cupy.asarray(...)` (or `from_dlpack`) and the
    candidate hands over bare: CuPy refuses a torch tensor, a module, a tuple."""
    wanted = _wrapped_positions(best)
    found = []
    for kernel, elements in _cupy_launch_arguments(candidate):
        for position in wanted.get(kernel, ()):
            if position < len(elements) and _wrapper_of(elements[position]) is None:
                found.append(f"TypeError: {kernel} argument {position} is no CuPy array")
    return found


def short_launches(candidate: cst.Module, best: cst.Module) -> list[str]:
    """Calls of a kernel the best launches CuPy's way (`k(grid, block, args)`) with fewer than
    those three arguments: `RawKernel.__call__` refuses them."""
    kernels = {kernel for kernel, _ in _cupy_launch_arguments(best)}
    return [
        f"TypeError: {_EMPTY.code_for_node(node.func)} launched without its grid, block and args"
        for node in all_nodes(candidate)
        if isinstance(node, cst.Call)
        and _EMPTY.code_for_node(node.func) in kernels
        and len(node.args) < 3
        and not any(a.star for a in node.args)
    ]


def _wrapped_positions(module: cst.Module) -> dict[str, set[int]]:
    positions: dict[str, set[int]] = {}
    for kernel, elements in _cupy_launch_arguments(module):
        for k, element in enumerate(elements):
            if _wrapper_of(element) is not None:
                positions.setdefault(kernel, set()).add(k)
    return positions


def _cupy_launch_arguments(
    module: cst.Module,
) -> Iterator[tuple[str, tuple[cst.BaseExpression, ...]]]:
    """(kernel, its arguments as written) for each CuPy launch `kernel(grid, block, args)`."""
    return ((la.kernel, la.written) for la in launches(module) if la.block is not None)


def _wrapper_of(value: cst.BaseExpression) -> str | None:
    if isinstance(value, cst.Call) and value.args:
        name = dotted(value.func)
        if name in ARRAY_WRAPPERS:
            return name
    return None


def _binds_unseen(module: cst.Module) -> bool:
    for node in all_nodes(module):
        if isinstance(node, cst.Global | cst.Nonlocal | cst.ImportStar):
            return True
        if isinstance(node, cst.Name) and node.value in _DYNAMIC:
            return True
    return False


def _reads(node: cst.CSTNode) -> Iterator[str]:
    """The names `node` reads when it runs (not a lambda's, a comprehension's or a keyword's,
    not an attribute's own name, not what an assignment binds)."""
    if isinstance(node, cst.Name):
        yield node.value
    elif isinstance(node, (*_SCOPES, cst.Import, cst.ImportFrom, cst.Del)):
        return
    elif isinstance(node, cst.Attribute | cst.Arg):  # not `x.attr`'s attr, not `f(key=)`'s key
        yield from _reads(node.value)
    elif isinstance(node, cst.Assign):
        yield from _reads(node.value)
        for target in node.targets:
            yield from _target_reads(target.target)
    elif isinstance(node, cst.AnnAssign):
        if node.value is not None:
            yield from _reads(node.value)
        yield from _target_reads(node.target)
    elif isinstance(node, cst.AugAssign):
        yield from _reads(node.value)
        yield from _reads(node.target)  # `x += 1` reads x
    else:
        for child in child_nodes(node):
            yield from _reads(child)


def _target_reads(target: cst.CSTNode) -> Iterator[str]:
    """What assigning to `target` reads: `x[i] = v` reads x and i, `x = v` nothing."""
    if isinstance(target, cst.Tuple | cst.List):
        for element in target.elements:
            yield from _target_reads(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _target_reads(target.value)
    elif isinstance(target, cst.Attribute):
        yield from _reads(target.value)
    elif isinstance(target, cst.Subscript):
        yield from _reads(target.value)
        for element in target.slice:
            yield from _reads(element)


def _binds(statement: cst.SimpleStatementLine) -> set[str]:
    """The names a simple statement binds."""
    names: set[str] = set()
    for small in statement.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                names |= _target_names(target.target)
        elif isinstance(small, cst.AnnAssign | cst.AugAssign):
            names |= _target_names(small.target)
        elif isinstance(small, cst.Import):
            for alias in small.names:
                names.add(_alias_name(alias, first=True))
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            for alias in small.names:
                names.add(_alias_name(alias, first=False))
    return names


def _target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple | cst.List):
        return {n for e in target.elements for n in _target_names(e.value)}
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return set()


def _alias_name(alias: cst.ImportAlias, *, first: bool) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    dotted = _EMPTY.code_for_node(alias.name)
    return dotted.split(".")[0] if first else dotted
