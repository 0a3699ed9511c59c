"""Triton kernels that cannot fault, seen without running them.

A memory fault is an access: a launch that touches no memory cannot make one. Triton's compiler
drops a load nothing uses (a load that is not `volatile` only reads, and MLIR erases an op
whose results go unused and whose only effect is a read), so a kernel with no store, no atomic
and nothing else that could write launches and reads nothing at all. Reductions of Triton
fault scripts offered such kernels every round: `tl.store(o_ptr, c)` deleted, or hoisted to its
pointer (`o_ptr + offs` as a statement). On the H200 each was a compile and a launch (1-3 s)
for a run that passed; the last rounds of `cuda_triton_expand_bias` and
`cuda_triton_int32_offsets` offered three (benchmarks/last_round.py).

A kernel whose every access that stays (each store and atomic, each load whose value reaches
one) lands inside the tensor the launch hands its pointer cannot fault either: `offs = pid *
BLOCK` simplified to `offs = 0` or `offs = BLOCK`, `tl.store(o_ptr, c)` with `c` loaded at
`c_ptr + 0`, a grid of `(n,)` whose program ids stay inside the tensors once `n = 1`, each
against tensors the script sizes itself (`torch.randn((8, 2048, 151936), device=...)`): most
of the rest of those last rounds. Offsets are spans read from integers, the launch's integer
arguments, `tl.program_id` of a grid the script fixes, `tl.arange` of constant ends, `+ - *`
of those and the names the kernel binds once to them. A span that may leave int32
is not read (a kernel's offsets are int32: `pid * BLOCK` past 2**31 wraps negative, the bug of
`cuda_triton_int32_offsets`); masks are not read (every offset counts as accessed); anything
else, or a tensor whose size the script does not spell out, leaves the kernel to the run.

Only the kernel the failing call launches is read, and only when every call in it is known: a
`triton.language` function or a method of a value, none of them one that writes, prints,
asserts or runs inline assembly; a call of anything else (a helper `@triton.jit` function, a
module's function) may write, and leaves the kernel to the run.
"""

from __future__ import annotations

import libcst as cst

from reprocut.source.cupy_launches import at_top
from reprocut.source.doomed import binds_unseen, reads, target_names, top_level_bindings
from reprocut.source.passes.focus_calls import focus_calls
from reprocut.source.passes.launches import (
    dimensions,
    factory_numel,
    followed,
    integer,
    literal_numel,
)
from reprocut.source.passes.tree import dotted
from reprocut.source.passes.walk import all_nodes, walk
from reprocut.source.uncompilable import binding_counts, bound_in, is_jit

# parts of a call's name that may write memory or have another effect a compiler keeps
# (`tl.store`, `tl.atomic_add`, a descriptor's `.store` or `.scatter`, `tl.device_print`,
# `tl.device_assert`, `tl.inline_asm_elementwise`), or read where this does not look (a
# descriptor's `.load` or `.gather`)
_EFFECTS = ("store", "atomic", "scatter", "print", "assert", "asm", "load", "gather")
# builtins a kernel calls at compile time (`range` of a loop, `min` of two constexprs)
_BUILTINS = frozenset({"range", "min", "max", "abs", "int", "float", "bool", "len"})
_LANGUAGE = ("tl.", "triton.language.")
# views that keep their base's storage and its first element where it was
_SAME_START = frozenset({"expand", "view", "t", "transpose", "permute", "unsqueeze", "squeeze"})
# methods that copy a tensor that is not contiguous (to its numel() elements, which an
# `as_strided` view may have fewer of than its storage): read only on a factory's tensor
_COPY_UNLESS_CONTIGUOUS = frozenset({"reshape", "flatten", "contiguous"})

Span = tuple[int, int]  # the lowest and the highest offset, in elements


def faultless_launches(module: cst.Module, focus: str | None) -> list[str]:
    """Why the failing call's Triton kernel cannot fault (empty: it may)."""
    found = []
    for call in focus_calls(module, focus):
        name = _launched_kernel(call)
        definitions = [
            node for node in all_nodes(module)
            if isinstance(node, cst.FunctionDef) and node.name.value == name
        ]  # fmt: skip
        if len(definitions) != 1 or not definitions[0].decorators:
            continue
        kernel = definitions[0]
        if not all(is_jit(d) for d in kernel.decorators):
            continue
        if writes_nothing(kernel):
            found.append(f"no memory access: kernel {name} stores nothing")
        elif (
            at_top(module, focus)
            and not binds_unseen(module)
            and lands_inside(kernel, call, _top_bindings(module))
        ):
            found.append(f"no memory fault: every access of kernel {name} lands in its tensor")
    return list(dict.fromkeys(found))


def _top_bindings(module: cst.Module) -> dict[str, list[cst.BaseExpression]]:
    """The module-level names bound only by plain assignments, with their values."""
    bound, otherwise = top_level_bindings(module)
    return {k: v for k, v in bound.items() if k not in otherwise}


def _launched_kernel(call: cst.Call) -> str | None:
    """`k` of `k[grid](...)` and of `torch.library.wrap_triton(k)[grid](...)`."""
    if not isinstance(call.func, cst.Subscript):
        return None
    launched = call.func.value
    if isinstance(launched, cst.Call) and (dotted(launched.func) or "").endswith("wrap_triton"):
        launched = launched.args[0].value if len(launched.args) == 1 else launched
    return launched.value if isinstance(launched, cst.Name) else None


def writes_nothing(kernel: cst.FunctionDef) -> bool:
    """Nothing in the kernel can write or keep a load alive."""
    calls = _memory_calls(kernel)
    return calls is not None and not calls[0]


def _memory_calls(kernel: cst.FunctionDef) -> tuple[list[cst.Call], list[cst.Call]] | None:
    """The kernel's stores and atomics, and its loads; None when a call may do what is not
    read here: a helper `@triton.jit` function or another module's function (it may write), a
    print, an assert, inline assembly, a volatile load (the compiler keeps it)."""
    local = bound_in(kernel.body.body) | set(_parameters(kernel))
    effects: list[cst.Call] = []
    loads: list[cst.Call] = []
    for node in walk(kernel.body):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(node.func)
        last = name.rsplit(".", 1)[-1] if name else _method_name(node.func)
        if last is None:
            return None
        if any(a.keyword is not None and a.keyword.value == "volatile" for a in node.args):
            return None
        language = name is not None and name.startswith(_LANGUAGE)
        if language and (last == "store" or last.startswith("atomic_")):
            effects.append(node)
        elif language and last == "load":
            loads.append(node)
        elif any(effect in last for effect in _EFFECTS):
            return None
        elif language or name is None:
            continue  # a triton.language function, a method of a computed value
        elif not ("." in name and name.split(".", 1)[0] in local) and name not in _BUILTINS:
            return None  # not a method of a local value or a parameter: it may write
    return effects, loads


def _method_name(func: cst.BaseExpression) -> str | None:
    return func.attr.value if isinstance(func, cst.Attribute) else None


# --- accesses at constant offsets --------------------------------------------------------------


def lands_inside(kernel: cst.FunctionDef, call: cst.Call,
                 bound: dict[str, list[cst.BaseExpression]]) -> bool:  # fmt: skip
    """Every access the kernel keeps is at constant offsets from a pointer parameter, inside
    the tensor the launch hands that parameter."""
    accesses = _kept_accesses(kernel)
    if not accesses:
        return False
    arguments = _launch_arguments(kernel, call)
    if arguments is None:
        return False
    constants = _kernel_constants(kernel, arguments, bound, _program_ids(call, bound))
    for pointer in accesses:
        pointers = set(_parameters(kernel)) - set(constants) - set(binding_counts(kernel.body.body))
        at = _address(pointer, constants, pointers)
        if at is None:
            return False
        name, (low, high) = at
        elements = tensor_elements(arguments[name], bound) if name in arguments else None
        if elements is None or low < 0 or high >= elements:
            return False
    return True


def _kept_accesses(kernel: cst.FunctionDef) -> list[cst.BaseExpression] | None:
    """The pointer of each store and atomic, and of each load whose value reaches one (or a
    branch's test, or a loop's range); None where that is not read here."""
    calls = _memory_calls(kernel)
    if calls is None:
        return None
    effects, loads = calls
    sources: dict[str, set[str]] = {}  # a name the kernel assigns: the names its values read
    owners: dict[int, set[str]] = {}  # a node of an assigned value: the names assigned it
    live: set[str] = set()
    for node in walk(kernel.body):
        if isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign) and node.value is not None:
            targets = (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            )
            names = {n for t in targets for n in target_names(t)}
            for name in names:
                sources.setdefault(name, set()).update(reads(node.value))
                if isinstance(node, cst.AugAssign):
                    sources[name].add(name)
            for inner in walk(node.value):
                owners.setdefault(id(inner), set()).update(names)
        elif isinstance(node, cst.If | cst.While):
            live |= set(reads(node.test))
        elif isinstance(node, cst.For):
            live |= set(reads(node.iter))
    for effect in effects:
        live |= set(reads(effect))
    grown = True
    while grown:
        grown = False
        for name, read in sources.items():
            if name in live and not read <= live:
                live |= read
                grown = True
    in_effects = {id(n) for effect in effects for n in walk(effect)}
    if any(id(load) not in in_effects and id(load) not in owners for load in loads):
        return None  # a load elsewhere: a branch's test, an expression statement
    kept = [load for load in loads if id(load) in in_effects or owners[id(load)] & live]
    pointers = [_pointer_of(c) for c in (*effects, *kept)]
    return None if any(p is None for p in pointers) else pointers  # type: ignore[return-value]


def _pointer_of(call: cst.Call) -> cst.BaseExpression | None:
    positional = [a.value for a in call.args if a.keyword is None]
    if positional:
        return positional[0]
    return next((a.value for a in call.args if a.keyword and a.keyword.value == "pointer"), None)


def _parameters(kernel: cst.FunctionDef) -> list[str]:
    params = kernel.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


def _launch_arguments(kernel: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression] | None:  # fmt: skip
    """Each parameter's argument in the launch, or its default."""
    if any(a.star for a in call.args):
        return None
    params = kernel.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None:
        return None
    names = _parameters(kernel)
    arguments = {p.name.value: p.default for p in (*params.posonly_params, *params.params,
                 *params.kwonly_params) if p.default is not None}  # fmt: skip
    positional = [a.value for a in call.args if a.keyword is None]
    arguments.update(zip(names, positional, strict=False))
    arguments.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})
    return arguments


def _program_ids(call: cst.Call, bound: dict[str, list[cst.BaseExpression]]) -> dict[str, Span]:
    """`tl.program_id(k)`'s span for each axis of a grid the script fixes (`(n,)`,
    `(triton.cdiv(n, 2),)`), under the key `program_id(k)` (no name can be that)."""
    assert isinstance(call.func, cst.Subscript)
    index = call.func.slice[0].slice if len(call.func.slice) == 1 else None
    if not isinstance(index, cst.Index):
        return {}
    dims = dimensions(index.value, bound)
    if not dims or None in dims or len(dims) > 3:
        return {}
    padded = [*dims, 1, 1][:3]
    return {f"program_id({k})": (0, d - 1) for k, d in enumerate(padded) if d is not None}


def _kernel_constants(kernel: cst.FunctionDef, arguments: dict[str, cst.BaseExpression],
                      bound: dict[str, list[cst.BaseExpression]],
                      program_ids: dict[str, Span]) -> dict[str, Span]:  # fmt: skip
    """The integer spans of the parameters the launch passes an integer (and the kernel never
    assigns), of the program ids, and of the names the kernel binds once, at its top level,
    to an integer expression of those."""
    counts = binding_counts(kernel.body.body)
    constants: dict[str, Span] = dict(program_ids)
    for name, argument in arguments.items():
        value = integer(argument, bound)
        if value is not None and name not in counts:
            constants[name] = (value, value)
    for statement in kernel.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target = small.targets[0].target
                if isinstance(target, cst.Name) and counts.get(target.value) == 1:
                    span = _integer(small.value, constants)
                    if span is not None:
                        constants[target.value] = span
    return constants


def _integer(value: cst.BaseExpression, constants: dict[str, Span]) -> Span | None:
    """The span of an integer expression, None where it may leave int32 (a kernel's offsets
    are int32 arithmetic: `pid * BLOCK` past 2**31 wraps negative, the very bug of
    cuda_triton_int32_offsets)."""
    span = _span(value, constants)
    if span is None or span[0] < -(2**31) or span[1] > 2**31 - 1:
        return None
    return span


def _span(value: cst.BaseExpression, constants: dict[str, Span]) -> Span | None:
    """Literals, known names, `tl.program_id` of a known grid, `tl.arange` of constant ends,
    and `+`, `-`, `*` of those; None for anything else."""
    if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith(".program_id"):
        axis = value.args[0].value if len(value.args) == 1 and not value.args[0].keyword else None
        return constants.get(f"program_id({axis.value})") if isinstance(axis, cst.Integer) else None
    if isinstance(value, cst.Integer):
        number = int(value.evaluated_value)
        return (number, number)
    if isinstance(value, cst.Name):
        return constants.get(value.value)
    if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith(".arange"):
        ends = [_integer(a.value, constants) for a in value.args if a.keyword is None]
        if len(ends) == 2 and ends[0] is not None and ends[1] is not None:
            low, high = ends[0][0], ends[1][0] - 1
            return (low, high) if ends[0][0] == ends[0][1] and ends[1][0] == ends[1][1] else None
        return None
    if isinstance(value, cst.BinaryOperation):
        left, right = _integer(value.left, constants), _integer(value.right, constants)
        if isinstance(value.operator, cst.Multiply) and (0, 0) in (left, right):
            return (0, 0)  # `pid * BLOCK` with BLOCK=0
        if left is None or right is None:
            return None
        if isinstance(value.operator, cst.Add):
            return (left[0] + right[0], left[1] + right[1])
        if isinstance(value.operator, cst.Subtract):
            return (left[0] - right[1], left[1] - right[0])
        if isinstance(value.operator, cst.Multiply):
            products = [a * b for a in left for b in right]
            return (min(products), max(products))
    return None


def _address(pointer: cst.BaseExpression, constants: dict[str, Span],
             parameters: set[str]) -> tuple[str, Span] | None:  # fmt: skip
    """(the pointer parameter, the span of offsets from it) of `p`, `p + k`, `k + p`, `p - k`."""
    if isinstance(pointer, cst.Name) and pointer.value in parameters:
        return pointer.value, (0, 0)
    if isinstance(pointer, cst.BinaryOperation) and isinstance(
        pointer.operator, cst.Add | cst.Subtract
    ):
        base = _address(pointer.left, constants, parameters)
        offset = _integer(pointer.right, constants)
        if base is None and isinstance(pointer.operator, cst.Add):
            base = _address(pointer.right, constants, parameters)
            offset = _integer(pointer.left, constants)
        if base is None or offset is None:
            return None
        name, (low, high) = base
        if isinstance(pointer.operator, cst.Subtract):
            return name, (low - offset[1], high - offset[0])
        return name, (low + offset[0], high + offset[1])
    return None


def tensor_elements(value: cst.BaseExpression, bound: dict[str, list[cst.BaseExpression]],
                    seen: frozenset[str] = frozenset()) -> int | None:  # fmt: skip
    """How many elements the tensor `value` makes has from its first on, as the script spells
    it out: a factory of literal sizes, its views, a name bound once to one; None otherwise."""
    if isinstance(value, cst.Name):
        values = bound.get(value.value, [])
        if len(values) != 1 or value.value in seen:
            return None
        return tensor_elements(values[0], bound, seen | {value.value})
    if not isinstance(value, cst.Call):
        return None
    name = dotted(value.func) or ""
    positional = [a.value for a in value.args if a.keyword is None]
    sizes = [a.value for a in value.args if a.keyword is not None and a.keyword.value == "size"]
    if name.startswith("torch.") and name.count(".") == 1:
        factory = name[6:]
        if factory == "randint":  # its size after low and high
            shape = sizes[0] if sizes else positional[-1] if len(positional) >= 2 else None
            return None if shape is None else literal_numel([shape])
        return factory_numel(value)
    if isinstance(value.func, cst.Attribute):
        base = tensor_elements(value.func.value, bound, seen)
        method = value.func.attr.value
        if base is None:
            return None
        if method in _SAME_START:
            return base
        if method in _COPY_UNLESS_CONTIGUOUS:
            fresh = followed(value.func.value, bound)
            made = dotted(fresh.func) if isinstance(fresh, cst.Call) else None
            return base if made is not None and made.startswith("torch.") else None
        if method == "as_strided":
            offset = positional[2] if len(positional) >= 3 else None
            start = 0 if offset is None else integer(offset, bound)
            return None if start is None else base - start
    return None
