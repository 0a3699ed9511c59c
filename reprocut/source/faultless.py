"""Triton kernels that cannot fault, seen without running them.

A memory fault is an access: a launch that touches no memory cannot make one. Triton's compiler
drops a load nothing uses (a load that is not `volatile` only reads, and MLIR erases an op
whose results go unused and whose only effect is a read), so a kernel with no store, no atomic
and nothing else that could write launches and reads nothing at all. Reductions of Triton
fault scripts offered such kernels every round: `tl.store(o_ptr, c)` deleted, or hoisted to its
pointer (`o_ptr + offs` as a statement). On the H200 each was a compile and a launch (1-3 s)
for a run that passed; the last rounds of `cuda_triton_expand_bias` and
`cuda_triton_int32_offsets` offered three (benchmarks/last_round.py).

Only the kernel the failing call launches is read, and only when every call in it is known: a
`triton.language` function or a method of a value, none of them one that writes, prints,
asserts or runs inline assembly; a call of anything else (a helper `@triton.jit` function, a
module's function) may write, and leaves the kernel to the run.
"""

from __future__ import annotations

import libcst as cst

from reprocut.source.passes.tree import dotted, focus_calls
from reprocut.source.passes.walk import all_nodes, walk
from reprocut.source.uncompilable import bound_in, is_jit

# parts of a call's name that may write memory or have another effect a compiler keeps
# (`tl.store`, `tl.atomic_add`, a descriptor's `.store` or `.scatter`, `tl.device_print`,
# `tl.device_assert`, `tl.inline_asm_elementwise`)
_EFFECTS = ("store", "atomic", "scatter", "print", "assert", "asm")
# builtins a kernel calls at compile time (`range` of a loop, `min` of two constexprs)
_BUILTINS = frozenset({"range", "min", "max", "abs", "int", "float", "bool", "len"})
_LANGUAGE = ("tl.", "triton.language.")


def faultless_launches(module: cst.Module, focus: str | None) -> list[str]:
    """Why the failing call's Triton kernel cannot fault (empty: it may)."""
    kernels = {_launched_kernel(call) for call in focus_calls(module, focus)} - {None}
    found = []
    for name in sorted(k for k in kernels if k is not None):
        definitions = [
            node for node in all_nodes(module)
            if isinstance(node, cst.FunctionDef) and node.name.value == name
        ]  # fmt: skip
        if len(definitions) != 1 or not definitions[0].decorators:
            continue
        kernel = definitions[0]
        if all(is_jit(d) for d in kernel.decorators) and writes_nothing(kernel):
            found.append(f"no memory access: kernel {name} stores nothing")
    return found


def _launched_kernel(call: cst.Call) -> str | None:
    """`k` of `k[grid](...)` and of `torch.library.wrap_triton(k)[grid](...)`."""
    if not isinstance(call.func, cst.Subscript):
        return None
    launched = call.func.value
    if isinstance(launched, cst.Call) and (dotted(launched.func) or "").endswith("wrap_triton"):
        launched = launched.args[0].value if len(launched.args) == 1 else launched
    return launched.value if isinstance(launched, cst.Name) else None


def writes_nothing(kernel: cst.FunctionDef) -> bool:
    """Nothing in the kernel can write or keep a load alive: every call is a known one that
    has no effect (a volatile load is kept by the compiler; a call of anything else may
    write)."""
    local = bound_in(kernel.body.body) | {
        p.name.value for p in (*kernel.params.posonly_params, *kernel.params.params,
                               *kernel.params.kwonly_params)
    }  # fmt: skip
    for node in walk(kernel.body):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(node.func)
        last = name.rsplit(".", 1)[-1] if name else _method_name(node.func)
        if last is None or any(effect in last for effect in _EFFECTS):
            return False
        if any(a.keyword is not None and a.keyword.value == "volatile" for a in node.args):
            return False
        if name is None or name.startswith(_LANGUAGE):
            continue  # a method of a computed value: `(a + b).to(tl.float32)`
        owner = name.split(".", 1)[0]
        if "." in name and owner in local:
            continue  # a method of a local value or a parameter: `x.to(tl.float32)`
        if name not in _BUILTINS:
            return False  # a helper kernel, another module's function: it may write
    return True


def _method_name(func: cst.BaseExpression) -> str | None:
    return func.attr.value if isinstance(func, cst.Attribute) else None
