"""Kernel launches as a script writes them, and what their grid and block come to.

A Triton launch is `kernel[grid](args)`; a CuPy one `kernel(grid, block, args)`, `args` a tuple
or a name bound to one. The validity rules read the launches (what reaches a kernel, whether its
configuration changed or became invalid) and `shrink_integers` keeps the integers a grid or block
is made of at 1 or more: a launch of 0 threads per block is an invalid configuration, not a
smaller repro (a shrunk CuPy launch read `ROWSUM((rows,), (0,), ...)`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import libcst as cst

from reprocut.source.passes.tree import dotted
from reprocut.source.passes.walk import all_nodes, walk

MAX_THREADS = 1024  # threads per block on every CUDA GPU since compute capability 2.0
# a grid's largest dims: x, and y and z (CUDA refuses more; Triton and CuPy pass y and z as a
# C int, Triton x too: past these the launch raises before any kernel runs)
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
_EMPTY = cst.Module([])


def code_of(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


# A candidate's module is read by a dozen validity rules, several of them asking for its
# launches and bindings: each is computed once per module (a module hashes by identity) and
# shared, so what these return is not to be changed.


@lru_cache(maxsize=8)
def module_scope(module: cst.Module) -> tuple[cst.CSTNode, ...]:
    """The module's nodes outside any function, class or lambda body (a `def`'s own node
    included: it binds its name there)."""
    return tuple(walk(module, prune=lambda node: isinstance(node, _SCOPES)))


@lru_cache(maxsize=16)
def bindings(module: cst.Module, *, top: bool = False) -> dict[str, list[cst.BaseExpression]]:
    """Every value each plain name is assigned, anywhere in the module, or (`top`) outside any
    function's body (`a, b = x, 256` binds each name to its own value). Shared: read only."""
    return assignments(module_scope(module) if top else all_nodes(module))


def assignments(nodes: Iterable[cst.CSTNode]) -> dict[str, list[cst.BaseExpression]]:
    """Every value each plain name is assigned by the assignments among `nodes`."""
    bound: dict[str, list[cst.BaseExpression]] = {}
    for node in nodes:
        if isinstance(node, cst.Assign):
            for target in node.targets:
                for name, value in assigned_pairs(target.target, node.value):
                    bound.setdefault(name, []).append(value)
    return bound


def assigned_pairs(
    target: cst.BaseAssignTargetExpression, value: cst.BaseExpression
) -> list[tuple[str, cst.BaseExpression]]:
    """(name, value) for each name the assignment binds to a value of its own: `a, b = x, 256`
    gives both, `a, b = x.shape` neither."""
    if isinstance(target, cst.Name):
        return [(target.value, value)]
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple):
        names, values = target.elements, value.elements
        if len(names) == len(values) and not any(
            isinstance(e, cst.StarredElement) for e in (*names, *values)
        ):
            return [pair for n, v in zip(names, values, strict=True) for pair in assigned_pairs(n.value, v.value)]  # fmt: skip
    return []


@dataclass(frozen=True, slots=True)
class Launch:
    """A kernel launch as written: the kernel, its grid/block text, its arguments, and the
    grid and block expressions themselves (no block for Triton: its kernel sets its own)."""

    kernel: str
    config: str
    args: tuple[cst.BaseExpression, ...]
    grid: cst.BaseExpression | None = None
    block: cst.BaseExpression | None = None
    written: tuple[cst.BaseExpression, ...] = ()  # a CuPy launch's arguments before unwrapping


@lru_cache(maxsize=8)
def launches(module: cst.Module) -> tuple[Launch, ...]:
    """Triton `kernel[grid](args)` and CuPy `kernel(grid, block, args)` calls."""
    bound = bindings(module)
    found = []
    for node in all_nodes(module):
        if not isinstance(node, cst.Call):
            continue
        if isinstance(node.func, cst.Subscript):
            kernel = code_of(node.func.value)
            index = node.func.slice[0].slice if len(node.func.slice) == 1 else None
            grid = index.value if isinstance(index, cst.Index) else None
            config = code_of(node.func.slice[0]) if node.func.slice else ""
            found.append(Launch(kernel, config, tuple(a.value for a in node.args), grid))
            continue
        written = _cupy_arguments(node, bound)
        if written is not None:
            grid, block = node.args[0].value, node.args[1].value
            config = f"{code_of(grid)}, {code_of(block)}"
            items = tuple(_unwrapped(e) for e in written)
            found.append(Launch(code_of(node.func), config, items, grid, block, written))
    return tuple(found)


def _cupy_arguments(
    node: cst.Call, bound: dict[str, list[cst.BaseExpression]]
) -> tuple[cst.BaseExpression, ...] | None:
    """A CuPy launch's kernel arguments as written: `k((blocks,), (threads,), (a, b, n))`."""
    if len(node.args) < 3 or any(a.keyword for a in node.args[:3]):
        return None
    if not all(isinstance(a.value, (cst.Tuple, cst.Name)) for a in node.args[:2]):
        return None
    args = node.args[2].value
    if isinstance(args, cst.Name) and len(bound.get(args.value, [])) == 1:
        args = bound[args.value][0]
    if not isinstance(args, cst.Tuple):
        return None
    return tuple(e.value for e in args.elements)


def _unwrapped(value: cst.BaseExpression) -> cst.BaseExpression:
    """`cupy.asarray(x)` (or `cp.asarray`, `from_dlpack`) -> `x`: the tensor it views."""
    if isinstance(value, cst.Call) and value.args:
        name = code_of(value.func).rsplit(".", 1)[-1]
        if name in ("asarray", "from_dlpack", "fromDlpack"):
            return value.args[0].value
    return value


# --- what a grid or block comes to ------------------------------------------------------------


def dimensions(
    value: cst.BaseExpression | None, bound: dict[str, list[cst.BaseExpression]]
) -> tuple[int | None, ...]:
    """A grid's or block's dims as far as the script fixes them: `(rows, 0)` -> (None, 0);
    a name assigned once is followed (`threads = 256`); a single value is one dim."""
    value = _followed(value, bound, set())
    if isinstance(value, cst.Tuple | cst.List):
        return tuple(
            integer(element.value, bound)
            for element in value.elements
            if not isinstance(element, cst.StarredElement)
        )
    return () if value is None else (integer(value, bound),)


def integer(value: cst.BaseExpression, bound: dict[str, list[cst.BaseExpression]]) -> int | None:
    """The int an expression of integer literals, names assigned once to one, + - * // %,
    `triton.cdiv` and a literal-sized torch factory's `numel()` comes to; None when the script
    does not fix it."""
    return _integer(value, bound, set())


def _integer(
    value: cst.BaseExpression | None, bound: dict[str, list[cst.BaseExpression]], seen: set[str]
) -> int | None:
    value = _followed(value, bound, seen)
    if isinstance(value, cst.Integer):
        return int(value.value.replace("_", ""), 0)
    if (  # `torch.randn((8, 2048, 151936)).numel()`, or a name bound once to the factory
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "numel"
        and not value.args
    ):
        made = _followed(value.func.value, bound, seen)
        return factory_numel(made) if isinstance(made, cst.Call) else None
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        inner = _integer(value.expression, bound, seen)
        return None if inner is None else -inner
    if isinstance(value, cst.Call) and (dotted(value.func) or "") in ("triton.cdiv", "cdiv"):
        parts = [_integer(a.value, bound, seen) for a in value.args if a.keyword is None]
        if len(parts) == 2 and parts[0] is not None and parts[1]:
            return -(-parts[0] // parts[1])
        return None
    if isinstance(value, cst.BinaryOperation):
        left, right = _integer(value.left, bound, seen), _integer(value.right, bound, seen)
        if left is None or right is None:
            return None
        if isinstance(value.operator, cst.Add):
            return left + right
        if isinstance(value.operator, cst.Subtract):
            return left - right
        if isinstance(value.operator, cst.Multiply):
            return left * right
        if isinstance(value.operator, cst.FloorDivide | cst.Modulo) and right:
            return left // right if isinstance(value.operator, cst.FloorDivide) else left % right
    return None


# torch factories whose size is their first argument(s) (`full`: its first alone)
SIZED_FACTORIES = frozenset({"empty", "zeros", "ones", "rand", "randn", "full"})


def factory_numel(call: cst.Call) -> int | None:
    """The elements a torch factory of literal sizes makes (`torch.randn((8, 2048), ...)`,
    `torch.zeros(8, 2048)`, `size=`); None for anything else. A grid of `n` programs where `n`
    is such a tensor's `numel()` is then known: on the H200 a Triton grid of 2.5 G programs
    (int32_offsets' `(n,)` for `(triton.cdiv(n, 1024),)`) raised OverflowError three times."""
    name = dotted(call.func) or ""
    if not (name.startswith("torch.") and name.count(".") == 1 and name[6:] in SIZED_FACTORIES):
        return None
    sizes = [a.value for a in call.args if a.keyword is not None and a.keyword.value == "size"]
    if sizes:
        return literal_numel(sizes)
    positional = [a.value for a in call.args if a.keyword is None]
    return literal_numel(positional[:1] if name == "torch.full" else positional)


def literal_numel(sizes: list[cst.BaseExpression]) -> int | None:
    """The product of literal sizes: `(256, 256, 4096)`, or `256, 4096` given apart."""
    if len(sizes) == 1 and isinstance(sizes[0], cst.Tuple | cst.List):
        sizes = [e.value for e in sizes[0].elements]
    numbers = [int(s.evaluated_value) if isinstance(s, cst.Integer) else None for s in sizes]
    if not numbers or any(n is None for n in numbers):
        return None
    return math.prod(n for n in numbers if n is not None)


def followed(
    value: cst.BaseExpression, bound: dict[str, list[cst.BaseExpression]]
) -> cst.BaseExpression:
    """What a name assigned exactly once stands for, followed to the end (else `value`)."""
    found = _followed(value, bound, set())
    return value if found is None else found


def _followed(
    value: cst.BaseExpression | None, bound: dict[str, list[cst.BaseExpression]], seen: set[str]
) -> cst.BaseExpression | None:
    """A name assigned exactly once stands for its value (a cycle or a rebinding: unknown)."""
    while isinstance(value, cst.Name) and value.value not in seen:
        values = bound.get(value.value, [])
        if len(values) != 1:
            return value
        seen.add(value.value)
        value = values[0]
    return value


def invalid_configurations(module: cst.Module) -> list[str]:
    """Launches whose grid or block the script fixes to something CUDA refuses: a dim below 1,
    a grid over its limits (`grid = (n,)` for `(triton.cdiv(n, 2),)` with n = 2.5 G), a block
    of more than MAX_THREADS threads."""
    bound = bindings(module)
    problems = []
    for launch in launches(module):
        for what, value in (("grid", launch.grid), ("block", launch.block)):
            dims = dimensions(value, bound)
            shown = f"{launch.kernel} {what} {code_of(value)}" if value is not None else ""
            if any(d is not None and d < 1 for d in dims):
                problems.append(f"invalid launch: {shown} has a dim below 1")
            elif what == "grid" and _over_grid_limits(dims, cupy=launch.block is not None):
                problems.append(f"invalid launch: {shown} is over CUDA's grid limits")
            elif what == "block" and dims and None not in dims:
                threads = 1
                for d in dims:
                    threads *= d or 1
                if threads > MAX_THREADS:
                    problems.append(f"invalid launch: {shown} is {threads} threads, over 1024")
    return problems


def _over_grid_limits(dims: tuple[int | None, ...], *, cupy: bool) -> bool:
    """A grid dim CUDA refuses. CuPy casts x to a C int, which wraps from 2**32 on (a launch
    of that many blocks modulo 2**32): only the span below that is certainly refused."""
    x, rest = (dims[0] if dims else None), dims[1:]
    too_wide = x is not None and x > MAX_GRID_X and (not cupy or x < 2**32)
    return too_wide or any(d is not None and d > MAX_GRID_YZ for d in rest)


def configuration_integers(module: cst.Module) -> set[int]:
    """The `id`s of the integer literals a launch's grid or block is made of (directly, or
    through the names assigned once that it uses): a pass must keep each at 1 or more."""
    bound = bindings(module)
    found: set[int] = set()
    for launch in launches(module):
        for value in (launch.grid, launch.block):
            if value is not None:
                _collect(value, bound, found, set())
    return found


def _collect(
    value: cst.CSTNode, bound: dict[str, list[cst.BaseExpression]], found: set[int],
    seen: set[str],
) -> None:  # fmt: skip
    for node in walk(value):
        if isinstance(node, cst.Integer):
            found.add(id(node))
        elif isinstance(node, cst.Name) and node.value not in seen:
            values = bound.get(node.value, [])
            if len(values) == 1:
                seen.add(node.value)
                _collect(values[0], bound, found, seen)
