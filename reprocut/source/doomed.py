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
statement before it; a factory call missing a positional argument it requires, or given a
number where its size must be a sequence (`torch.randint(0, 7)`); a name bound to a literal
(`ids = 0`, simplify_expressions' value) called, indexed, or read for an attribute its type
lacks (`ids.shape`) before the failing call or by it (what a CuPy launch refuses:
reprocut.source.cupy_launches). Anything that
could bind names unseen (`global`, star imports, `exec`, `globals()`) turns the name rule off;
compound statements (loops, branches, `with`) count as binding every name in them; a `def` or
`class` binds its own name and reads its decorators (`@triton.jit` with `triton` deleted).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from functools import lru_cache

import libcst as cst

from reprocut.source.passes.focus_calls import focus_calls
from reprocut.source.passes.launches import assigned_pairs, bindings, module_scope
from reprocut.source.passes.tree import alias_name, dotted
from reprocut.source.passes.walk import all_nodes, child_nodes, of_type, paths_to, walk

# module globals every script has besides the builtins
_MODULE_NAMES = frozenset({
    "__name__", "__file__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__",
    "__annotations__", "__cached__",
})  # fmt: skip
ALWAYS_BOUND = frozenset(dir(builtins)) | _MODULE_NAMES
# names through which a script can bind globals that no statement shows
_DYNAMIC = frozenset({"globals", "exec", "eval", "vars", "locals", "setattr", "__import__"})
_SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_UNEVALUATED = (*_SCOPES, cst.Del)  # what runs later, if at all, or reads nothing
_UNREAD = frozenset({*_UNEVALUATED, cst.Import, cst.ImportFrom})  # by type: no subtypes

# factories and the positional arguments they require (`size=` and the like count as one)
REQUIRED_ARGUMENTS = {
    "torch.randn": 1, "torch.rand": 1, "torch.zeros": 1, "torch.ones": 1, "torch.empty": 1,
    "torch.full": 2, "torch.randint": 2, "torch.tensor": 1, "torch.as_tensor": 1,
    "torch.arange": 1, "torch.as_strided": 3, "torch.from_numpy": 1,
    "cupy.asarray": 1, "cp.asarray": 1, "cupy.from_dlpack": 1, "cp.from_dlpack": 1,
    "np.asarray": 1, "numpy.asarray": 1, "cupy.RawKernel": 2, "cp.RawKernel": 2,
    "triton.cdiv": 2,
}  # fmt: skip
# keywords that are not what a factory makes (its size, its values)
OPTIONS = frozenset({
    "device", "dtype", "layout", "requires_grad", "pin_memory", "generator", "out",
    "memory_format", "names", "options", "backend", "jitify", "enable_cooperative_groups",
})  # fmt: skip
# factories whose size must be a sequence, by its positional index (-1: the last given):
# `torch.randint(0, 7)` reads 7 as its size and raises, as `torch.full(5, 1.0)` does
SEQUENCE_SIZE = {"torch.randint": -1, "torch.full": 0}
# methods of a tensor and the positional arguments they require
REQUIRED_METHOD_ARGUMENTS = {"as_strided": 2, "expand": 1, "view": 1, "reshape": 1}
_MODULES = ("torch.", "cupy.", "cp.", "np.", "numpy.", "triton.")
_EMPTY = cst.Module([])


def raises_before_the_call(module: cst.Module, focus: str | None) -> list[str]:
    """Why `module` raises before its failing call (empty: it may reach it)."""
    return [*unbound_names(module, focus), *missing_arguments(module)]


def unbound_names(module: cst.Module, focus: str | None) -> list[str]:
    """`NameError: x` for each name read before any statement binds it, up to the failing
    call, and `TypeError` when the failing call's callee is bound to a module or a literal
    (a hoisted kernel source, `_KERNEL = cupy`); nothing when the call is not made at top
    level or names may be bound unseen."""
    calls = focus_calls(module, focus)
    if not calls or binds_unseen(module):
        return []
    holding = paths_to(module, [id(call) for call in calls])  # the calls and what holds them
    walruses = paths_to(module, [id(node) for node in of_type(module, cst.NamedExpr)])
    bound = set(ALWAYS_BOUND)
    modules: set[str] = set()  # names last bound to a module (`import cupy`, `k = cupy`)
    literals: dict[str, type] = {}  # names last bound to a literal, by the literal's type
    found = []
    for statement in module.body:
        if id(statement) in holding:
            if isinstance(statement, cst.SimpleStatementLine):
                call = next(c for c in calls if id(statement) in paths_to(module, [id(c)]))
                found += [f"NameError: {n}" for n in reads(call) if n not in bound]
                callee = call.func.value if isinstance(call.func, cst.Name) else None
                if callee in modules:
                    found.append(f"TypeError: {callee} is a module")
                elif callee in literals:
                    found.append(f"TypeError: {callee} is a literal")
                else:
                    found += misused_literals(call, literals)
            break
        if isinstance(statement, cst.SimpleStatementLine) and id(statement) not in walruses:
            found += [f"NameError: {n}" for n in reads(statement) if n not in bound]
            found += misused_literals(statement, literals)
            names = binds(statement)
            made_modules = _bound_modules(statement, modules)
            made_literals = _literal_types(statement, literals)
            _forget(names, modules, literals)
            bound |= names
            modules |= made_modules
            literals.update(made_literals)
        elif isinstance(statement, cst.FunctionDef | cst.ClassDef):
            # a definition reads its decorators (and a class its bases) when it runs, and
            # binds its own name only: its body runs later, if at all
            found += [f"NameError: {n}" for n in _definition_reads(statement) if n not in bound]
            bound.add(statement.name.value)
            _forget({statement.name.value}, modules, literals)
        else:  # a block: every name in it may be bound by it, to anything
            names = {node.value for node in walk(statement) if isinstance(node, cst.Name)}
            bound |= names
            _forget(names, modules, literals)
    return list(dict.fromkeys(found))


# what a literal's value can be indexed as
_SUBSCRIPTABLE = (str, bytes, tuple, list, dict)


def misused_literals(node: cst.CSTNode, literals: dict[str, type]) -> list[str]:
    """What `node` does, as it runs, to a name bound to a literal that no such value allows:
    calls it, indexes a number or None, reads an attribute its type lacks (`ids.shape` once
    `ids = torch.randint(...)` was simplified to `ids = 0`)."""
    found: list[str] = []
    if not literals:  # nothing bound to a literal: nothing to misuse
        return found
    for child in _evaluated(node):
        if isinstance(child, cst.Call | cst.Subscript):
            name = child.func if isinstance(child, cst.Call) else child.value
            kind = literals.get(name.value) if isinstance(name, cst.Name) else None
            if kind is None or (isinstance(child, cst.Subscript) and kind in _SUBSCRIPTABLE):
                continue
            what = "called" if isinstance(child, cst.Call) else "indexed"
            found.append(f"TypeError: {name.value} ({kind.__name__}) {what}")  # type: ignore[union-attr]
        elif isinstance(child, cst.Attribute) and isinstance(child.value, cst.Name):
            kind = literals.get(child.value.value)
            if kind is not None and not hasattr(kind, child.attr.value):
                found.append(
                    f"AttributeError: {kind.__name__} {child.value.value}.{child.attr.value}"
                )
    return found


def _evaluated(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node` and what runs with it: not the bodies of lambdas and comprehensions, not `del`."""
    return walk(node, prune=lambda n: isinstance(n, _UNEVALUATED))


def _literal_types(
    statement: cst.SimpleStatementLine, literals: dict[str, type]
) -> dict[str, type]:
    """Names a statement binds to a literal (`x = 0`, `x = None`, `y = x`), with its type."""
    found = {}
    for small in statement.body:
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value = small.targets[0].target, small.value
            kind = literals.get(value.value) if isinstance(value, cst.Name) else None
            kind = kind or _literal_type(value)
            if isinstance(target, cst.Name) and kind is not None:
                found[target.value] = kind
    return found


# a tensor's methods whose value is an int: with no argument, and with one dim given
_COUNTS = frozenset({"numel", "nelement", "dim", "ndimension", "element_size"})
_COUNTS_OF_A_DIM = frozenset({"size", "stride"})


def _counted(call: cst.Call) -> bool:
    """`x.numel()`, `x.size(0)`: an int, which has no tensor's attributes. On the H200 a hoist
    made `out = torch.empty(ids.numel(), ...)` into `out = ids.numel()`, and the CuPy launch's
    `out.data_ptr()` raised AttributeError (host_pointers, twice at 8257a0d)."""
    if not isinstance(call.func, cst.Attribute):
        return False
    method = call.func.attr.value
    if method in _COUNTS:
        return not call.args
    return method in _COUNTS_OF_A_DIM and len(call.args) == 1 and call.args[0].keyword is None


def _literal_type(value: cst.BaseExpression) -> type | None:
    if isinstance(value, cst.Call):
        return int if _counted(value) else None
    if isinstance(value, cst.Name):
        return {"None": type(None), "True": bool, "False": bool}.get(value.value)
    if isinstance(value, cst.UnaryOperation):  # `-1`, `+1`, `~1`, `not 1`
        operand = _literal_type(value.expression)
        if operand in (int, float, complex, bool):
            return bool if isinstance(value.operator, cst.Not) else operand
        return None
    if isinstance(value, cst.SimpleString):
        return bytes if "b" in value.prefix.lower() else str
    simple = {cst.Integer: int, cst.Float: float, cst.Imaginary: complex, cst.Tuple: tuple,
              cst.List: list, cst.Dict: dict, cst.Set: set, cst.FormattedString: str,
              cst.ConcatenatedString: str}  # fmt: skip
    return simple.get(type(value))


def _definition_reads(statement: cst.FunctionDef | cst.ClassDef) -> Iterator[str]:
    """What a `def` or `class` statement reads as it runs: its decorators, a function's
    defaults, a class's bases and keywords (not annotations: they may be strings, or deferred)."""
    for decorator in statement.decorators:
        yield from reads(decorator.decorator)
    if isinstance(statement, cst.ClassDef):
        for arg in (*statement.bases, *statement.keywords):
            yield from reads(arg.value)
        return
    params = statement.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        if param.default is not None:
            yield from reads(param.default)


def _forget(names: set[str], modules: set[str], literals: dict[str, type]) -> None:
    """Names bound again, to what is not known here."""
    modules -= names
    for name in names:
        literals.pop(name, None)


def _bound_modules(statement: cst.SimpleStatementLine, modules: set[str]) -> set[str]:
    """The names this statement binds to a module: `import x`, `k = x` for such an x."""
    found = set()
    for small in statement.body:
        if isinstance(small, cst.Import):
            found |= {alias_name(a, first=True) for a in small.names}
        elif isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value = small.targets[0].target, small.value
            if (
                isinstance(target, cst.Name)
                and isinstance(value, cst.Name)
                and value.value in modules
            ):
                found.add(target.value)
    return found


def missing_arguments(module: cst.Module) -> list[str]:
    """`TypeError: f() needs n` for each factory call with fewer arguments than it requires
    (`torch.randn(size=(2,))` has its size; `torch.randn(device="cuda")` has none), and for a
    size that must be a sequence given as a number (`torch.randint(0, 7)`, the tuple dropped)."""
    found = []
    for call in (n for n in all_nodes(module) if isinstance(n, cst.Call)):
        needed = _required(call.func)
        if needed is None or any(a.star for a in call.args):
            continue
        shown = dotted(call.func) or _EMPTY.code_for_node(call.func)
        given = [a for a in call.args if a.keyword is None or a.keyword.value not in OPTIONS]
        if len(given) < needed:
            found.append(f"TypeError: {shown}() without its {needed} argument(s)")
        elif _size_is_a_number(shown, call):
            found.append(f"TypeError: {shown}() given a number for its size")
    return found


def _size_is_a_number(name: str, call: cst.Call) -> bool:
    index = SEQUENCE_SIZE.get(name)
    positional = [a.value for a in call.args if a.keyword is None]
    if (
        index is None
        or not positional
        or any(a.keyword.value == "size" for a in call.args if a.keyword)
    ):
        return False
    return _literal_type(positional[index]) in (int, float, bool)


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


@lru_cache(maxsize=4)
def top_level_bindings(
    module: cst.Module,
) -> tuple[dict[str, list[cst.BaseExpression]], frozenset[str]]:
    """The module-level names with the values plain assignments give them, and the names bound
    some other way too (`bound_otherwise`): read by several rules of one candidate
    (source/cupy_launches.py, source/faultless.py), computed once for it (a module is hashed by
    identity; the dict is not to be changed)."""
    return bindings(module, top=True), frozenset(bound_otherwise(module, top=True))


def bound_otherwise(module: cst.Module, *, top: bool = False) -> set[str]:
    """Names bound other than by a plain assignment somewhere: a loop's, a `with`'s, an
    augmented or annotated assignment's, an import's, a definition's or a parameter's (a
    function's `ids` is not the module's), a handler's, a walrus's (what they hold is not read
    here). `top`: outside any function's body only, where a module-level call reads."""
    names: set[str] = set()
    for node in module_scope(module) if top else all_nodes(module):
        if type(node) not in _BINDING_KINDS:  # most nodes: by type, as no such kind has subtypes
            continue
        if isinstance(node, cst.For | cst.CompFor):
            names |= target_names(node.target)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            names |= target_names(node.asname.name)
        elif isinstance(node, cst.AugAssign | cst.AnnAssign):
            names |= target_names(node.target)
        elif isinstance(node, cst.Import | cst.ImportFrom) and not isinstance(
            node.names, cst.ImportStar
        ):
            names |= {alias_name(a, first=True) for a in node.names}
        elif isinstance(node, cst.FunctionDef | cst.ClassDef | cst.Param):
            names.add(node.name.value)
        elif isinstance(node, cst.ExceptHandler) and node.name is not None:
            names |= target_names(node.name.name)
        elif isinstance(node, cst.NamedExpr):
            names |= target_names(node.target)
        elif isinstance(node, cst.Assign):  # `a, b = x.shape`: what each holds is not known
            for target in node.targets:
                paired = {name for name, _ in assigned_pairs(target.target, node.value)}
                names |= target_names(target.target) - paired
    return names


_BINDING_KINDS = frozenset({
    cst.For, cst.CompFor, cst.WithItem, cst.AugAssign, cst.AnnAssign, cst.Import, cst.ImportFrom,
    cst.FunctionDef, cst.ClassDef, cst.Param, cst.ExceptHandler, cst.NamedExpr, cst.Assign,
})  # fmt: skip


@lru_cache(maxsize=8)
def binds_unseen(module: cst.Module) -> bool:
    """Could a name be bound where no assignment shows it (`global`, `import *`, `exec`)?"""
    if any(of_type(module, kind) for kind in (cst.Global, cst.Nonlocal, cst.ImportStar)):
        return True
    return any(name.value in _DYNAMIC for name in of_type(module, cst.Name))


def reads(node: cst.CSTNode) -> Iterator[str]:
    """The names `node` reads when it runs (not a lambda's, a comprehension's or a keyword's,
    not an attribute's own name, not what an assignment binds). Kinds are told by type: it
    reads every node of every candidate, and none of these kinds has subtypes."""
    kind = type(node)
    if kind is cst.Name:
        yield node.value  # type: ignore[attr-defined]
    elif kind in _UNREAD:
        return
    elif kind is cst.Attribute or kind is cst.Arg:  # not `x.attr`'s attr, not `f(key=)`'s key
        yield from reads(node.value)  # type: ignore[attr-defined]
    elif kind is cst.Assign:
        assert isinstance(node, cst.Assign)
        yield from reads(node.value)
        for target in node.targets:
            yield from _target_reads(target.target)
    elif kind is cst.AnnAssign:
        assert isinstance(node, cst.AnnAssign)
        if node.value is not None:
            yield from reads(node.value)
        yield from _target_reads(node.target)
    elif kind is cst.AugAssign:
        assert isinstance(node, cst.AugAssign)
        yield from reads(node.value)
        yield from reads(node.target)  # `x += 1` reads x
    else:
        for child in child_nodes(node):
            yield from reads(child)


def _target_reads(target: cst.CSTNode) -> Iterator[str]:
    """What assigning to `target` reads: `x[i] = v` reads x and i, `x = v` nothing."""
    if isinstance(target, cst.Tuple | cst.List):
        for element in target.elements:
            yield from _target_reads(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _target_reads(target.value)
    elif isinstance(target, cst.Attribute):
        yield from reads(target.value)
    elif isinstance(target, cst.Subscript):
        yield from reads(target.value)
        for element in target.slice:
            yield from reads(element)


def binds(statement: cst.SimpleStatementLine) -> set[str]:
    """The names a simple statement binds."""
    names: set[str] = set()
    for small in statement.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                names |= target_names(target.target)
        elif isinstance(small, cst.AnnAssign | cst.AugAssign):
            names |= target_names(small.target)
        elif isinstance(small, cst.Import):
            for alias in small.names:
                names.add(alias_name(alias, first=True))
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            for alias in small.names:
                names.add(alias_name(alias, first=False))
    return names


def target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, cst.Tuple | cst.List):
        return {n for e in target.elements for n in target_names(e.value)}
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return set()
