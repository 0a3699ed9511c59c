"""Triton kernels that cannot compile, seen without running them.

A `@triton.jit` function is compiled at its launch, the failing call: a candidate whose kernel
does not compile raises a CompilationError there instead of the fault. On the H200, 72 of the
172 checks of a Triton memory-fault reduction (`cuda_triton_expand_bias`) ended so, and 15 more
in a launch missing one of the kernel's parameters: `tl.arange(0)` without its end, `offs =
tl` (a call hoisted to its module), `pid * BLOCK` with `pid` deleted, `k[grid](x, out)` without
`n`. Each still paid a CUDA context and the launch's compile (1.4 s alone).

Only what certainly fails is named, for kernels decorated with `triton.jit` alone (an autotuned
kernel takes some parameters from its configs): a name that neither the kernel's parameters, its
body nor the module bind; a module (`tl`, `triton`) used as a value; a `tl` function called
with fewer arguments than it requires; None or a number where a value or a pointer is needed
(`x = None`, `tl.load(0)`: on the H200 30 of one reduction's 42 expression simplifications);
a launch that leaves a parameter without a default unpassed; a call of torch, numpy or CuPy
(host code); a global the kernel reads that the module binds to a torch tensor (Triton reads
only constexpr globals: `x = tl.load(...)` deleted leaves the store reading the script's `x`).
The values' kinds have rules of their own (reprocut.source.triton_kinds). The validity rules
(reprocut.source.validity) reject a candidate for a problem its best does not have;
`benchmarks/bench_triton_rules.py` holds all of them against Triton's own compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import libcst as cst

from reprocut.source.cupy_launches import global_tensors
from reprocut.source.doomed import (
    ALWAYS_BOUND,
    binds,
    binds_unseen,
    reads,
    target_names,
)
from reprocut.source.passes.tree import alias_name, dotted
from reprocut.source.passes.walk import child_nodes, of_type, walk

# triton.language functions and the arguments they require (keywords count: `tl.zeros(shape,
# dtype=...)` has its two)
REQUIRED_ARGUMENTS = {
    "program_id": 1, "num_programs": 1, "arange": 2, "load": 1, "store": 2, "where": 3,
    "zeros": 2, "full": 3, "maximum": 2, "minimum": 2, "atomic_add": 2, "atomic_max": 2,
    "atomic_min": 2, "atomic_cas": 3, "atomic_xchg": 2, "dot": 2, "cdiv": 2, "exp": 1,
    "log": 1, "sqrt": 1, "abs": 1, "sum": 1, "max": 1, "min": 1, "broadcast_to": 2,
    "reshape": 2, "multiple_of": 2, "max_contiguous": 2,
}  # fmt: skip
_LANGUAGE = ("tl.", "triton.language.")


def uncompilable_kernels(module: cst.Module) -> list[str]:
    """Why a Triton kernel of `module` cannot compile (empty: it may)."""
    kernels = jit_kernels(module)
    if not kernels or binds_unseen(module):
        return []
    known = ALWAYS_BOUND | bound_in(module.body)
    imported = _imported_modules(module)
    modules = set(imported)
    hosts = {name for name, package in imported.items() if package in _HOST_PACKAGES}
    tensors = global_tensors(module)
    found: list[str] = []
    for kernel in kernels:
        local = _parameters(kernel) | bound_in(kernel.body.body)
        name = kernel.name.value
        body = kernel.body.body
        read = [n for statement in body for n in reads(statement)]
        found += [f"NameError: {n} in kernel {name}" for n in read if n not in known | local]
        found += [f"CompilationError: kernel {name} reads the global tensor {n}"
                  for n in read if n in tensors - local]  # fmt: skip
        found += [f"CompilationError: module {n} as a value in kernel {name}"
                  for n in _bare_names(body) if n in modules - local]  # fmt: skip
        found += [f"CompilationError: {call}() without its {needed} argument(s) in kernel {name}"
                  for call, needed in _short_calls(body)]  # fmt: skip
        found += [f"CompilationError: {why} in kernel {name}" for why in _no_values(body)]
        found += [f"CompilationError: {why} in kernel {name}" for why in _malformed(body)]
        found += [f"CompilationError: {call}() of no pointer in kernel {name}"
                  for call in _pointerless(kernel, modules)]  # fmt: skip
        found += [f"CompilationError: {call}() called in kernel {name}"
                  for call in _host_calls(body, hosts - local)]  # fmt: skip
        found += _unpassed(module, kernel)
        found += _called_without_grid(module, kernel)
    return list(dict.fromkeys(found))


def jit_kernels(module: cst.Module) -> list[cst.FunctionDef]:
    """The functions of `module` decorated with `triton.jit` alone (an autotuned kernel takes
    some parameters from its configs)."""
    return [node for node in of_type(module, cst.FunctionDef)
            if node.decorators and all(is_jit(d) for d in node.decorators)]  # fmt: skip


def is_jit(decorator: cst.Decorator) -> bool:
    """`@triton.jit`, `@jit` (from triton), or either called with options."""
    expression = decorator.decorator
    if isinstance(expression, cst.Call):
        expression = expression.func
    return dotted(expression) in ("triton.jit", "jit")


def bound_in(statements: Sequence[cst.CSTNode]) -> set[str]:
    """Every name the statements bind, in their blocks too (`if`, `try`, `for`, `with`):
    assignments, imports, loop and `with` targets, handlers' names, definitions' names; not
    what the bodies of the functions and classes they define bind."""
    names: set[str] = set()
    for statement in statements:
        if isinstance(statement, cst.BaseSmallStatement):  # a one-line body's: `def f(): x = 1`
            statement = cst.SimpleStatementLine([statement])
        if isinstance(statement, cst.SimpleStatementLine):
            names |= binds(statement)
            names |= {n.target.value for n in walk(statement)  # by type: neither has subtypes
                      if type(n) is cst.NamedExpr and type(n.target) is cst.Name}  # fmt: skip
            continue
        if isinstance(statement, cst.FunctionDef | cst.ClassDef):
            names.add(statement.name.value)
            continue
        if isinstance(statement, cst.For):
            names |= target_names(statement.target)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None:
                    names |= target_names(item.asname.name)
        elif isinstance(statement, cst.ExceptHandler) and statement.name is not None:
            names |= target_names(statement.name.name)
        blocks = [c for c in child_nodes(statement) if not isinstance(c, cst.BaseExpression)]
        names |= bound_in(blocks)
    return names


def _parameters(kernel: cst.FunctionDef) -> set[str]:
    params = kernel.params
    names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    return names


# packages whose functions run on the host only: a kernel that calls one cannot compile
# ("Unsupported function referenced": replace_with_specs put `torch.randn(...)` for a kernel's
# local of the module's tensor's name on the H200)
_HOST_PACKAGES = frozenset({"torch", "numpy", "cupy"})


def _imported_modules(module: cst.Module) -> dict[str, str]:
    """The names `import x` / `import x.y as z` bind to a module, outside function bodies, each
    with the package it comes from (`np`: numpy)."""
    names: dict[str, str] = {}
    for node in _outside(module, _is_function):
        if isinstance(node, cst.Import):
            for alias in node.names:
                package = cst.Module([]).code_for_node(alias.name).split(".")[0]
                names[alias_name(alias, first=True)] = package
    return names


def _host_calls(body: Sequence[cst.CSTNode], hosts: set[str]) -> Iterator[str]:
    """The calls of a host package's functions in a kernel's body (`torch.randn(...)`)."""
    for statement in body:
        for node in walk(statement):
            if isinstance(node, cst.Call):
                name = dotted(node.func) or ""
                if name.split(".")[0] in hosts:
                    yield name


def _outside(node: cst.CSTNode, excluded: Callable[[cst.CSTNode], bool]) -> Iterator[cst.CSTNode]:
    """The nodes below `node` outside any node `excluded` is true of (those left out too)."""
    for found in walk(node, prune=lambda n: n is not node and excluded(n)):
        if found is not node and not excluded(found):
            yield found


def _is_function(node: cst.CSTNode) -> bool:
    return type(node) is cst.FunctionDef


def _bare_names(body: Sequence[cst.CSTNode]) -> Iterator[str]:
    """Names the body uses as values: not an attribute's owner (`tl` of `tl.load`) or its own
    name (`math` of `tl.math.exp`), not a keyword's, a parameter's or a definition's name."""
    nodes = [node for statement in body for node in walk(statement)]
    named: set[int] = set()
    for node in nodes:
        if isinstance(node, cst.Attribute):
            named |= {id(node.value), id(node.attr)}
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            named.add(id(node.keyword))
        elif isinstance(node, cst.Param | cst.FunctionDef | cst.ClassDef):
            named.add(id(node.name))
    for node in nodes:
        if isinstance(node, cst.Name) and id(node) not in named:
            yield node.value


def language_call(node: cst.CSTNode) -> str | None:
    """The dotted name of a `triton.language` call written without `*args` (`tl.load`), else
    None: the calls the compile rules read."""
    if not isinstance(node, cst.Call) or any(a.star for a in node.args):
        return None
    name = dotted(node.func) or ""
    return name if name.startswith(_LANGUAGE) else None


def language_calls(body: Sequence[cst.CSTNode]) -> Iterator[tuple[str, cst.Call]]:
    """Each `triton.language` call in the kernel's body (`language_call`), with its name."""
    for statement in body:
        for node in walk(statement):
            name = language_call(node)
            if name is not None:
                assert isinstance(node, cst.Call)
                yield name, node


def _short_calls(body: Sequence[cst.CSTNode]) -> Iterator[tuple[str, int]]:
    for name, call in language_calls(body):
        needed = REQUIRED_ARGUMENTS.get(name.rsplit(".", 1)[-1])
        if needed is not None and len(call.args) < needed:
            yield name, needed


# triton.language functions whose first argument is a pointer (and, for stores, the second the
# value written)
POINTER_FIRST = ("load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_cas",
                  "atomic_xchg", "atomic_and", "atomic_or", "atomic_xor")  # fmt: skip


def _no_values(body: Sequence[cst.CSTNode]) -> Iterator[str]:
    """None where a kernel needs a value, or a number where it needs a pointer: `x = None`,
    `tl.load(0)`, `tl.store(None, v)`, `tl.store(p, None)` (a simplification of the kernel's
    expressions; Triton refuses them at compile time). A keyword's None (`mask=None`), a name
    bound to None and read only as a keyword's value (`mask = None` for `mask=mask`: Triton 3.6
    compiles it, as it does an unread one) and a comparison with None are left: they are how
    optional arguments are written."""
    valued = _read_as_values(body)
    for statement in body:
        for node in walk(statement):
            if (
                isinstance(node, cst.Assign)
                and _is_none(node.value)
                and any(n in valued for t in node.targets for n in target_names(t.target))
            ):
                yield "None assigned"
            name = language_call(node)
            if name is None or name.rsplit(".", 1)[-1] not in POINTER_FIRST:
                continue
            assert isinstance(node, cst.Call)
            positional = [a.value for a in node.args if a.keyword is None]
            if positional and _is_constant(positional[0]):
                yield f"{name}() of a constant, not a pointer"
            if name.endswith(".store") and len(positional) > 1 and _is_none(positional[1]):
                yield f"{name}() of None"


def _read_as_values(body: Sequence[cst.CSTNode]) -> set[str]:
    """Names the body reads other than as a keyword argument's value (`mask` of `x + mask`,
    not of `tl.load(p, mask=mask)`)."""
    nodes = [node for statement in body for node in walk(statement)]
    unread: set[int] = set()  # keywords' values and names, attributes' names, targets
    for node in nodes:
        if isinstance(node, cst.Arg) and node.keyword is not None:
            unread |= {id(node.value), id(node.keyword)}
        elif isinstance(node, cst.Attribute):
            unread.add(id(node.attr))
        elif isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name):
            unread.add(id(node.target))
    return {node.value for node in nodes if isinstance(node, cst.Name) and id(node) not in unread}


def _malformed(body: Sequence[cst.CSTNode]) -> Iterator[str]:
    """What the H200's check logs showed Triton refuse at compile time: a load, store or atomic
    without its pointer, a store without its value (`tl.store(p, mask=m)`: drop_arguments), a
    number for a mask (`mask=0`, or a name the kernel binds to one once), `tl.arange` of
    constant ends that make no range of a power of two, or of None (`tl.arange(0, 0)`)."""
    numbers = _names_bound_to_numbers(body)
    for name, call in language_calls(body):
        last = name.rsplit(".", 1)[-1]
        positional = [a.value for a in call.args if a.keyword is None]
        keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if last in POINTER_FIRST and not positional and "pointer" not in keywords:
            yield f"{name}() without its pointer"
        if last == "store" and len(positional) < 2 and "value" not in keywords:
            yield f"{name}() without its value"
        mask = keywords.get("mask")
        if (
            last in POINTER_FIRST
            and mask is not None
            and (
                isinstance(mask, cst.Integer | cst.Float)
                or (isinstance(mask, cst.Name) and mask.value in numbers)
            )
        ):
            yield f"{name}() of a number for its mask"
        if last == "arange" and len(positional) == 2:
            if any(_is_none(end) for end in positional):
                yield f"{name}() of None"
            elif all(isinstance(end, cst.Integer) for end in positional):
                start, end = (int(e.evaluated_value) for e in positional)  # type: ignore[union-attr]
                span = end - start
                if span < 1 or span & (span - 1):
                    yield f"{name}({start}, {end}): no range of a power of two"


def binding_counts(body: Sequence[cst.CSTNode]) -> dict[str, int]:
    """How often a kernel's statements bind each name (a loop's target or a walrus's: twice,
    never a constant)."""
    counts: dict[str, int] = {}
    for statement in body:
        for node in walk(statement):
            if isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]  # fmt: skip
                for name in (n for t in targets for n in target_names(t)):
                    counts[name] = counts.get(name, 0) + 1
            elif isinstance(node, cst.For | cst.NamedExpr):
                for name in target_names(node.target):
                    counts[name] = counts.get(name, 0) + 2
    return counts


def _names_bound_to_numbers(body: Sequence[cst.CSTNode]) -> set[str]:
    """Names the kernel binds exactly once, by a plain assignment of an integer or float."""
    once = {name for name, count in binding_counts(body).items() if count == 1}
    return {
        node.targets[0].target.value
        for statement in body for node in walk(statement)
        if isinstance(node, cst.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)
        and node.targets[0].target.value in once
        and isinstance(node.value, cst.Integer | cst.Float)
    }  # fmt: skip


def _pointerless(kernel: cst.FunctionDef, modules: set[str]) -> Iterator[str]:
    """`tl.load`/`tl.store`/atomics whose pointer reads none of the kernel's parameters, even
    through the names the body assigns (`tl.load(offs)` with `offs = tl.program_id(0)`): a
    kernel's pointers come from its parameters only (not its `tl.constexpr` ones). A name bound any other way than an
    assignment or a loop (a `with`, a walrus) may hold anything, and is taken as a pointer."""
    body = kernel.body.body
    sources: dict[str, set[str]] = {}  # a name the body assigns: the names its values read
    for statement in body:
        for node in walk(statement):
            if isinstance(node, cst.Assign | cst.AnnAssign | cst.AugAssign):
                targets = (
                    [t.target for t in node.targets]
                    if isinstance(node, cst.Assign)
                    else [node.target]
                )
                read = set(reads(node.value)) if node.value is not None else set()
                for target in targets:
                    for name in target_names(target):
                        sources.setdefault(name, set()).update(read)
                        if isinstance(node, cst.AugAssign):
                            sources[name].add(name)
            elif isinstance(node, cst.For):  # `for k in range(n)`: what the iterable reads
                for name in target_names(node.target):
                    sources.setdefault(name, set()).update(reads(node.iter))
    opaque = bound_in(body) - set(sources)
    pointers = (_parameters(kernel) - _constexpr_parameters(kernel)) | opaque
    changed = True
    while changed:
        changed = False
        for name, read in sources.items():
            if name not in pointers and read & pointers:
                pointers.add(name)
                changed = True
    # what certainly holds no pointer: the locals made from none, the constexprs, the modules
    # (a name bound nowhere is the NameError rule's)
    plain = (set(sources) - pointers) | _constexpr_parameters(kernel) | modules | {"tl"}
    for name, call in language_calls(body):
        if name.rsplit(".", 1)[-1] not in POINTER_FIRST:
            continue
        positional = [a.value for a in call.args if a.keyword is None]
        pointer = positional[0] if positional else None
        if pointer is not None and not _is_constant(pointer) and set(reads(pointer)) <= plain:
            yield name


def _constexpr_parameters(kernel: cst.FunctionDef) -> set[str]:
    """Parameters annotated `tl.constexpr`: compile-time values, never pointers."""
    params = kernel.params
    return {
        p.name.value
        for p in (*params.posonly_params, *params.params, *params.kwonly_params)
        if p.annotation is not None
        and (dotted(p.annotation.annotation) or "").endswith("constexpr")
    }


def _called_without_grid(module: cst.Module, kernel: cst.FunctionDef) -> list[str]:
    """`kernel(...)` outside any kernel: a @triton.jit function runs only when launched
    (`kernel[grid](...)`); called as a function it raises before the launch."""
    found = []
    for node in _outside(module, _is_kernel):
        if isinstance(node, cst.Call) and dotted(node.func) == kernel.name.value:
            found.append(f"RuntimeError: {kernel.name.value} called without a grid")
    return found


def _is_kernel(node: cst.CSTNode) -> bool:
    return (
        type(node) is cst.FunctionDef
        and bool(node.decorators)
        and any(is_jit(d) for d in node.decorators)
    )


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _is_constant(node: cst.BaseExpression) -> bool:
    return _is_none(node) or isinstance(node, cst.Integer | cst.Float)


def launches_of(module: cst.Module, kernel: cst.FunctionDef) -> list[cst.Call]:
    """The kernel's launches, `kernel[grid](...)`, anywhere in the module."""
    return [node for node in of_type(module, cst.Call)
            if isinstance(node.func, cst.Subscript)
            and dotted(node.func.value) == kernel.name.value]  # fmt: skip


def _unpassed(module: cst.Module, kernel: cst.FunctionDef) -> list[str]:
    """`k[grid](...)` launches of the kernel that leave a parameter without a default out."""
    params = kernel.params
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None:
        return []
    ordered = [*params.posonly_params, *params.params]
    required = [p.name.value for p in (*ordered, *params.kwonly_params) if p.default is None]
    found = []
    for node in launches_of(module, kernel):
        if any(a.star for a in node.args):
            continue
        positional = [a for a in node.args if a.keyword is None]
        passed = {p.name.value for p in ordered[: len(positional)]}
        passed |= {a.keyword.value for a in node.args if a.keyword is not None}
        missing = [n for n in required if n not in passed]
        if missing:
            found.append(f"TypeError: {kernel.name.value} launched without {', '.join(missing)}")
    return found
