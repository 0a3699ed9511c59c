"""CuPy launches that raise at the launch, seen without running them.

`RawKernel.__call__(grid, block, args)` passes each argument by its type: a CuPy array as its
pointer, a Python or NumPy scalar by value, None as a null pointer, and refuses anything else
("Unsupported type"): a torch tensor, a tuple, a module. A candidate whose failing launch is
handed one raises a TypeError there instead of the fault. On the H200 the script reductions of
CuPy faults made them every round (`ids` for `ids.data_ptr()`, `table.shape` for
`table.shape[0]`, `x` for `cupy.asarray(x)`, the launch short of its args); the validity rules
(reprocut.source.validity) reject each unrun.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from reprocut.source.doomed import binds_unseen, top_level_bindings
from reprocut.source.passes.focus_calls import focus_callee, focus_calls
from reprocut.source.passes.launches import launches, module_scope
from reprocut.source.passes.tree import dotted
from reprocut.source.passes.walk import all_nodes

# the wrappers that make a CuPy array of a tensor
ARRAY_WRAPPERS = frozenset({"cupy.asarray", "cp.asarray", "cupy.from_dlpack", "cp.from_dlpack"})
_EMPTY = cst.Module([])


def refused_arguments(module: cst.Module, focus: str | None) -> list[str]:
    """`TypeError` for each argument of the failing CuPy launch (of a kernel the script makes
    with `cupy.RawKernel` or `get_function`) that is certainly a torch tensor or a tuple:
    `RawKernel.__call__` passes arrays, Python and NumPy scalars and None,
    and refuses anything else ("Unsupported type"). On the H200 hoist_subexpressions offered
    them every round: `ids` for `ids.data_ptr()`, `table.shape` for `table.shape[0]`, a name
    bound to either."""
    callee = focus_callee(focus)
    if callee is None or binds_unseen(module) or not at_top(module, focus):
        return []  # a call in a function reads its own names: not the module's
    bound, otherwise = top_level_bindings(module)
    if not any(_is_raw_kernel(value) for value in bound.get(callee, [])):
        return []  # another callable's arguments: not CuPy's rules
    found = []
    for launch in launches(module):
        if launch.block is None or launch.kernel != callee:
            continue
        for position, value in enumerate(launch.written):
            kind = certain_kind(value, bound, otherwise, frozenset())
            if kind is not None:
                found.append(f"TypeError: {callee} argument {position} is a {kind}")
    return found


def global_tensors(module: cst.Module) -> set[str]:
    """The names the module binds, outside any function, to torch tensors alone."""
    if binds_unseen(module):
        return set()
    bound, otherwise = top_level_bindings(module)
    return {
        name for name in bound
        if certain_kind(cst.Name(name), bound, otherwise, frozenset()) == "torch tensor"
    }  # fmt: skip


def at_top(module: cst.Module, focus: str | None) -> bool:
    """Every call of the failing line's callee is made outside any function's body."""
    calls = focus_calls(module, focus)
    top = {id(node) for node in module_scope(module)}
    return bool(calls) and all(id(call) in top for call in calls)


def _is_raw_kernel(value: cst.BaseExpression) -> bool:
    """`cupy.RawKernel(...)` or `module.get_function(...)`: called as `k(grid, block, args)`."""
    name = dotted(value.func) if isinstance(value, cst.Call) else None
    return bool(name) and (name.endswith("RawKernel") or name.endswith(".get_function"))


# tensor factories of torch and the tensor methods whose result is a tensor again
_TENSOR_FACTORIES = frozenset({
    "empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange",
    "linspace", "tensor", "as_tensor", "from_numpy", "eye", "empty_like", "zeros_like",
    "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
})  # fmt: skip
_TENSOR_METHODS = frozenset({
    "as_strided", "view", "expand", "reshape", "contiguous", "t", "transpose", "permute",
    "flatten", "unsqueeze", "squeeze", "narrow", "clone", "float", "half", "double", "int",
    "long", "bool", "cuda", "cpu", "to", "detach", "repeat", "mean", "sum", "prod", "abs",
    "exp", "log", "sqrt", "neg", "add", "sub", "mul", "div", "sigmoid", "relu", "softmax",
    "argmax", "argmin", "cumsum", "clamp", "index_select", "gather", "masked_fill",
})  # fmt: skip


def certain_kind(value: cst.BaseExpression, bound: dict[str, list[cst.BaseExpression]],
                  otherwise: frozenset[str], seen: frozenset[str]) -> str | None:  # fmt: skip
    """The "torch tensor" or "tuple" `value` certainly is, else None: a factory, a tensor's
    method, an element of a tensor or arithmetic on one, `.shape`, a tuple or list, or a name
    every assignment binds to one (`mean = x.mean()` for `x.mean().item()`)."""
    if isinstance(value, cst.Name):
        values = bound.get(value.value, [])
        if not values or value.value in otherwise or value.value in seen:
            return None
        kinds = {certain_kind(v, bound, otherwise, seen | {value.value}) for v in values}
        return kinds.pop() if len(kinds) == 1 else None
    if isinstance(value, cst.Tuple | cst.List) or (
        isinstance(value, cst.Attribute) and value.attr.value == "shape"
    ):
        return "tuple"
    if isinstance(value, cst.Subscript):  # `x[0]` of a tensor: a tensor (`x.shape[0]`: no)
        owner = certain_kind(value.value, bound, otherwise, seen)
        return owner if owner == "torch tensor" else None
    if isinstance(value, cst.BinaryOperation):  # `x * 2`: a tensor, or a raise before the launch
        sides = {certain_kind(v, bound, otherwise, seen) for v in (value.left, value.right)}
        return "torch tensor" if "torch tensor" in sides else None
    if not isinstance(value, cst.Call):
        return None
    name = dotted(value.func) or ""
    if name.count(".") == 1 and name.startswith("torch.") and name[6:] in _TENSOR_FACTORIES:
        return "torch tensor"
    if isinstance(value.func, cst.Attribute) and value.func.attr.value in _TENSOR_METHODS:
        owner = certain_kind(value.func.value, bound, otherwise, seen)
        return owner if owner == "torch tensor" else None
    return None


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
