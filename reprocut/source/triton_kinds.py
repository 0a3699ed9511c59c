"""Triton kernels whose values are used as their kinds forbid, seen without compiling them.

A kernel's parameters take their kinds from its launch: a torch tensor is a pointer, a Python
int an integer, a float a float. Its body makes scalars (`tl.program_id(0)`, a parameter) and
blocks (`tl.arange(0, BLOCK)`, anything computed from one). Hoisting a subexpression mixes
them up in ways Triton's compiler refuses: `x = x_ptr` (hoisted from `tl.load(x_ptr + offs)`)
then `x + c` adds a pointer and a float; `mask = offs` (from `offs < n`) masks with an integer;
`offs = tl.program_id(0)` leaves a scalar pointer with a block mask or a block value. On the
CPU, Triton 3.6's own compiler refused 70 of the 338 candidates the other rules admitted from
the bests of the H200's two Triton script reductions, 61 of them hoists
(`benchmarks/bench_triton_rules.py`).

Only what certainly fails is named, and only where every kind it rests on is known: a
parameter's from the kernel's single launch at module level (a tensor factory or a name bound
once to one, a literal), a local's from its single plain assignment in the kernel. What
Triton 3.6 refuses, per that compiler: a pointer in any arithmetic but `pointer + int` or
`pointer - int`, or beside a float; a mask that is not a comparison's (or a boolean's) result;
a block mask or a block value for a scalar pointer; `tl.arange` of constexpr ends (literals
or the launch's) that span no power of two.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from reprocut.source.cupy_launches import certain_kind
from reprocut.source.doomed import binds_unseen, top_level_bindings
from reprocut.source.passes.launches import module_scope
from reprocut.source.passes.tree import dotted
from reprocut.source.passes.walk import walk
from reprocut.source.uncompilable import binding_counts, jit_kernels, language_call, launches_of

# the accesses whose mask (and value) sit where the rules look: load(pointer, mask, ...),
# store(pointer, value, mask), atomic_add(pointer, value, mask)
_MASKED = ("load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg")
# torch factories whose default dtype is a float one, and the dtypes by the kind they hold
_FLOAT_FACTORIES = frozenset({"randn", "rand", "randn_like", "rand_like", "empty", "zeros", "ones"})  # fmt: skip
_FLOAT_DTYPES = frozenset({"float", "float32", "float16", "half", "bfloat16", "float64", "double"})  # fmt: skip
_INT_DTYPES = frozenset({"int", "int32", "int64", "long", "int16", "int8", "uint8", "short"})
_FLOAT_CASTS = frozenset({"float", "half", "bfloat16", "double"})  # tensor methods casting to
_INT_CASTS = frozenset({"int", "long", "short"})  # a dtype of that kind
_KEPT_METHODS = frozenset({
    "as_strided", "view", "expand", "reshape", "contiguous", "t", "transpose", "permute",
    "flatten", "unsqueeze", "squeeze", "narrow", "clone", "cuda", "detach", "repeat",
})  # fmt: skip


@dataclass(frozen=True)
class Kind:
    """What a kernel's value is: `what` "pointer", "int", "float", "bool" or None (a value of
    a kind not known); `block` True, False (a scalar) or None; `element` the kind a pointer
    points to ("int", "float", None); `value` an integer known at compile time."""

    what: str | None = None
    block: bool | None = None
    element: str | None = None
    value: int | None = None


UNKNOWN = Kind()


def mistyped_kernels(module: cst.Module) -> list[str]:
    """Why a `@triton.jit` kernel of `module` cannot compile, by its values' kinds (empty: it
    may)."""
    if binds_unseen(module):
        return []
    found: list[str] = []
    for kernel in jit_kernels(module):
        parameters = _parameter_kinds(module, kernel)
        if parameters is None:
            continue
        reader = _KernelKinds(kernel, parameters)
        name = kernel.name.value
        found += [f"CompilationError: {why} in kernel {name}" for why in reader.refused()]
    return list(dict.fromkeys(found))


def _parameter_kinds(module: cst.Module, kernel: cst.FunctionDef) -> dict[str, Kind] | None:
    """Each parameter's kind from the kernel's one launch (`kernel[grid](...)`), None where it
    is launched other than once, inside a function (whose names are not the module's), or
    with `*args`."""
    launches = launches_of(module, kernel)
    top = {id(node) for node in module_scope(module)}
    if len(launches) != 1 or id(launches[0]) not in top or any(a.star for a in launches[0].args):
        return None
    params = kernel.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None:
        return None
    ordered = [*params.posonly_params, *params.params, *params.kwonly_params]
    bound, otherwise = top_level_bindings(module)
    kinds = {p.name.value: UNKNOWN for p in ordered}
    positional = [a.value for a in launches[0].args if a.keyword is None]
    passed = dict(zip((p.name.value for p in ordered), positional, strict=False))
    passed |= {a.keyword.value: a.value for a in launches[0].args if a.keyword is not None}
    for param in ordered:
        value = passed.get(param.name.value, param.default)
        if value is not None:
            kinds[param.name.value] = _argument_kind(value, bound, otherwise, frozenset())
    return kinds


def _argument_kind(value: cst.BaseExpression, bound: dict[str, list[cst.BaseExpression]],
                   otherwise: frozenset[str], seen: frozenset[str]) -> Kind:  # fmt: skip
    """What a launch argument becomes in the kernel: a torch tensor a pointer, a literal its
    number (a constexpr's value known)."""
    if isinstance(value, cst.Integer):
        return Kind("int", False, value=int(value.evaluated_value))
    if isinstance(value, cst.Float):
        return Kind("float", False)
    if isinstance(value, cst.Name):
        once = _bound_once(value.value, bound, otherwise, seen)
        if once is None:
            return UNKNOWN
        return _argument_kind(once, bound, otherwise, seen | {value.value})
    if certain_kind(value, bound, otherwise, seen) == "torch tensor":
        return Kind("pointer", False, element=_element(value, bound, otherwise, seen))
    return UNKNOWN


def _bound_once(name: str, bound: dict[str, list[cst.BaseExpression]],
                otherwise: frozenset[str], seen: frozenset[str]) -> cst.BaseExpression | None:  # fmt: skip
    """The value of the one plain assignment that binds `name` at module level (None: bound
    otherwise too, more than once, or already being read)."""
    values = bound.get(name, [])
    if len(values) != 1 or name in otherwise or name in seen:
        return None
    return values[0]


def _element(value: cst.BaseExpression, bound: dict[str, list[cst.BaseExpression]],
             otherwise: frozenset[str], seen: frozenset[str]) -> str | None:  # fmt: skip
    """ "float" or "int": what a torch tensor expression holds, where its factory, its dtype or
    its last method says so."""
    if isinstance(value, cst.Name):
        once = _bound_once(value.value, bound, otherwise, seen)
        if once is None:
            return None
        return _element(once, bound, otherwise, seen | {value.value})
    if not isinstance(value, cst.Call):
        return None
    dtype = next((a.value for a in value.args if a.keyword and a.keyword.value == "dtype"), None)
    if dtype is not None:
        name = (dotted(dtype) or "").removeprefix("torch.")
        return "float" if name in _FLOAT_DTYPES else "int" if name in _INT_DTYPES else None
    name = dotted(value.func) or ""
    if name.startswith("torch.") and name.count(".") == 1:
        if name[6:] in _FLOAT_FACTORIES:
            return "float"
        if name[6:] in ("empty_like", "zeros_like", "ones_like") and value.args:
            return _element(value.args[0].value, bound, otherwise, seen)
        return None
    if isinstance(value.func, cst.Attribute):
        method = value.func.attr.value
        if method in _FLOAT_CASTS:
            return "float"
        if method in _INT_CASTS:
            return "int"
        if method in _KEPT_METHODS:
            return _element(value.func.value, bound, otherwise, seen)
    return None


class _KernelKinds:
    """The kinds of one kernel's values, and the operations on them Triton refuses."""

    def __init__(self, kernel: cst.FunctionDef, parameters: dict[str, Kind]) -> None:
        self.body = kernel.body.body
        self.parameters = parameters
        counts = binding_counts(self.body)
        self.nodes = [node for statement in self.body for node in walk(statement)]
        self.assigned: dict[str, cst.BaseExpression] = {}
        for node in self.nodes:
            if (
                isinstance(node, cst.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0].target, cst.Name)
                and counts.get(node.targets[0].target.value) == 1
            ):
                self.assigned[node.targets[0].target.value] = node.value
        self.rebound = set(counts) - set(self.assigned)
        self.known: dict[str, Kind] = {}
        self.arithmetic: dict[int, tuple[Kind, str | None]] = {}  # by the operation's id

    def kind(self, node: cst.BaseExpression, seen: frozenset[str] = frozenset()) -> Kind:
        """The kind of one expression of the body (UNKNOWN where anything it rests on is)."""
        if isinstance(node, cst.Integer):
            return Kind("int", False, value=int(node.evaluated_value))
        if isinstance(node, cst.Float):
            return Kind("float", False)
        if isinstance(node, cst.Name):
            return self._name(node.value, seen)
        if isinstance(node, cst.Comparison):
            sides = [self.kind(node.left, seen), *(self.kind(c.comparator, seen) for c in node.comparisons)]  # fmt: skip
            return Kind("bool", _either_block(sides))
        if isinstance(node, cst.BinaryOperation):
            return self._arithmetic(node, seen)[0]
        if isinstance(node, cst.Call):
            return self._call(node, seen)
        return UNKNOWN

    def _name(self, name: str, seen: frozenset[str]) -> Kind:
        if name in self.rebound or name in seen:
            return UNKNOWN
        if name in self.assigned:
            if name not in self.known:
                self.known[name] = self.kind(self.assigned[name], seen | {name})
            return self.known[name]
        return self.parameters.get(name, UNKNOWN)

    def _arithmetic(self, node: cst.BinaryOperation, seen: frozenset[str]) -> tuple[Kind, str | None]:  # fmt: skip
        """The operation's kind, and why Triton refuses it (None: it may not)."""
        if id(node) not in self.arithmetic:
            self.arithmetic[id(node)] = self._operation(node, seen)
        return self.arithmetic[id(node)]

    def _operation(self, node: cst.BinaryOperation, seen: frozenset[str]) -> tuple[Kind, str | None]:  # fmt: skip
        left, right = self.kind(node.left, seen), self.kind(node.right, seen)
        block = _either_block([left, right])
        pointer = "pointer" in (left.what, right.what)
        if pointer:
            other = right if left.what == "pointer" else left
            refused = None
            if other.what in ("pointer", "float"):
                refused = f"a pointer and a {other.what} in arithmetic"
            elif not isinstance(node.operator, cst.Add | cst.Subtract):
                refused = f"a pointer in `{_symbol(node.operator)}`"
            elif isinstance(node.operator, cst.Subtract) and right.what == "pointer":
                refused = "a pointer subtracted"
            if refused is None and other.what in ("int", "bool"):
                return Kind("pointer", block, element=_pointee(left, right)), None
            return UNKNOWN, refused
        if None in (left.what, right.what):
            return Kind(None, block), None
        if "float" in (left.what, right.what) or isinstance(node.operator, cst.Divide):
            return Kind("float", block), None
        if isinstance(node.operator, cst.BitAnd | cst.BitOr | cst.BitXor) and left.what == right.what == "bool":  # fmt: skip
            return Kind("bool", block), None
        return Kind("int", block), None

    def _call(self, node: cst.Call, seen: frozenset[str]) -> Kind:
        name = _language_name(node)
        if name in ("program_id", "num_programs"):
            return Kind("int", False)
        if name == "arange":
            return Kind("int", True)
        if name == "load":
            positional = [a.value for a in node.args if a.keyword is None]
            pointer = self.kind(positional[0], seen) if positional else UNKNOWN
            if pointer.what != "pointer":
                return UNKNOWN
            return Kind(pointer.element, pointer.block)
        return UNKNOWN

    def refused(self) -> Iterator[str]:
        """Each operation of the body its kinds make Triton refuse."""
        for node in self.nodes:
            if isinstance(node, cst.BinaryOperation):
                why = self._arithmetic(node, frozenset())[1]
                if why is not None:
                    yield why
            elif isinstance(node, cst.Call):
                yield from self._refused_call(node)

    def _refused_call(self, node: cst.Call) -> Iterator[str]:
        name = _language_name(node)
        positional = [a.value for a in node.args if a.keyword is None]
        keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if name in _MASKED and positional:
            pointer = self.kind(positional[0])
            at = 1 if name == "load" else 2  # load(pointer, mask), store(pointer, value, mask)
            mask = keywords.get("mask", positional[at] if len(positional) > at else None)
            if mask is not None and not (isinstance(mask, cst.Name) and mask.value == "None"):
                masked = self.kind(mask)
                if masked.what in ("int", "float", "pointer"):
                    yield f"tl.{name}() masked by a{'n' if masked.what == 'int' else ''} {masked.what}"  # fmt: skip
                if masked.block is True and pointer.block is False and pointer.what == "pointer":
                    yield f"tl.{name}() of a scalar pointer masked by a block"
            value = positional[1] if len(positional) > 1 else keywords.get("value")
            if name != "load" and value is not None:
                stored = self.kind(value)
                if stored.block is True and pointer.block is False and pointer.what == "pointer":
                    yield f"tl.{name}() of a block to a scalar pointer"
        if name == "arange" and len(positional) == 2:
            start, end = (self.kind(p).value for p in positional)
            if start is not None and end is not None:
                span = end - start
                if span < 1 or span & (span - 1):
                    yield f"tl.arange({start}, {end}): no range of a power of two"


def _language_name(node: cst.Call) -> str | None:
    """`load` of `tl.load(...)` (a `triton.language` call without `*args`), else None."""
    name = language_call(node)
    return None if name is None else name.rsplit(".", 1)[-1]


def _either_block(kinds: list[Kind]) -> bool | None:
    if any(k.block is True for k in kinds):
        return True
    return False if all(k.block is False for k in kinds) else None


def _pointee(left: Kind, right: Kind) -> str | None:
    return left.element if left.what == "pointer" else right.element


def _symbol(operator: cst.BaseBinaryOp) -> str:
    return cst.Module([]).code_for_node(operator).strip()
