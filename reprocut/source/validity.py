"""Static validity rules: candidates that cannot be the user's bug are never run.

A reduction of a script that faults in a custom kernel can slide to another bug with the same
error code: hand the kernel a CPU tensor's host pointer, the pointer of a temporary freed before
the launch, a smaller grid. Like C-Reduce's undefined-behaviour guard, cheap rules read each
candidate before it is run and reject one that breaks a rule the current best keeps:

- every pointer handed to a kernel (`x.data_ptr()`, a Triton or CuPy tensor argument) comes
  from a name bound to a tensor not built on the CPU (a temporary's pointer dangles);
- tensors stay on their device: no `.cpu()`, `.to("cpu")` or `device="cpu"` the best lacks;
- a launch keeps its grid and block (Triton `k[grid](...)`, CuPy `k(grid, block, args)`) unless
  the pass that made the candidate shrinks them deliberately (`RESHAPING_PASSES`);
- every launch stays a valid configuration: grid and block dims of 1 or more, at most 1024
  threads a block, as far as the script fixes them (a block of 0 threads is refused by CUDA,
  and read as a typo in a repro);
- a failing custom op (`ns::op`) is still registered and still called;
- random tensors stay seeded: a top-level `torch.manual_seed` the best has stays while torch's
  random generators are called (else each run draws other values: another bug, or none);
- nothing raises before the failing call: no name read before it is bound, no factory without
  its size (reprocut.source.doomed), no CuPy launch handed a bare tensor, a tuple or too few
  arguments (reprocut.source.cupy_launches);
- a Triton kernel still compiles and is launched with all its parameters
  (reprocut.source.uncompilable), its values used as their kinds allow
  (reprocut.source.triton_kinds);
- for a memory fault, the failing call's Triton kernel can still fault: not with no store (its
  loads are compiled away), nor with every access at constant offsets inside its tensors
  (reprocut.source.faultless).

The sanitizer at the end (reprocut.check.sanitizer) is the final word; these rules only keep
the search away from candidates no sanitizer run should be spent on.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst

from reprocut.check.childenv import SETS_ENVIRONMENT
from reprocut.source.cupy_launches import refused_arguments, short_launches, unwrapped_arrays
from reprocut.source.custom_ops import registers, walk
from reprocut.source.doomed import raises_before_the_call
from reprocut.source.faultless import faultless_launches
from reprocut.source.passes import (
    import_module_name,
    parse,
    seeds_its_randomness,
    sibling_file,
    sibling_imports,
)
from reprocut.source.passes.launches import (
    assignments,
    bindings,
    invalid_configurations,
    launches,
)
from reprocut.source.triton_kinds import mistyped_kernels
from reprocut.source.uncompilable import jit_kernels, uncompilable_kernels

# passes allowed to change a launch's grid or block (none of today's passes is one)
RESHAPING_PASSES: frozenset[str] = frozenset()
FACTORIES = frozenset({
    "empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange",
    "linspace", "tensor", "as_tensor", "from_numpy", "eye",
})  # fmt: skip
# tensor methods whose result is on the tensor's own device
SAME_DEVICE_METHODS = frozenset({
    "as_strided", "view", "expand", "expand_as", "reshape", "contiguous", "t", "transpose",
    "permute", "flatten", "unsqueeze", "squeeze", "narrow", "clone", "float", "half",
    "bfloat16", "int", "long", "repeat",
})  # fmt: skip
_EMPTY = cst.Module([])
UNSEEDED = "random tensors without a seed"


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _is_cpu_string(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value == "cpu"
    return (
        isinstance(node, cst.Call)
        and _code(node.func).endswith("device")
        and any(_is_cpu_string(arg.value) for arg in node.args)
    )


def builds_on_cpu(value: cst.BaseExpression) -> bool:
    """An expression that makes a CPU tensor: `x.cpu()`, `.to("cpu")`, a torch factory with no
    device (or the CPU's)."""
    if not isinstance(value, cst.Call):
        return False
    func = _code(value.func)
    if func.endswith(".cpu"):
        return True
    if (  # a view or a new layout of a CPU tensor: `torch.randn(n).as_strided(...)`
        isinstance(value.func, cst.Attribute)
        and value.func.attr.value in SAME_DEVICE_METHODS
        and builds_on_cpu(value.func.value)
    ):
        return True
    if func.endswith(".to") and value.args and _is_cpu_string(value.args[0].value):
        return True
    if func.startswith("torch.") and func.split(".")[-1] in FACTORIES and func.count(".") == 1:
        device = next((a.value for a in value.args if a.keyword and a.keyword.value == "device"), None)  # fmt: skip
        return device is None or _is_cpu_string(device)
    return False


def host_bindings(module: cst.Module) -> dict[str, list[cst.BaseExpression]]:
    """`bindings(module)` less the names bound inside Triton kernels: a kernel's values
    (`x = tl.load(x_ptr)`) are never what the host hands a launch. Counted in, a kernel's `x`
    beside the script's `x = torch.randn(n)` hid that tensor's CPU device: the H200's
    expand_bias reduction (8257a0d) ran two candidates that Triton refused ("Pointer argument
    cannot be accessed from Triton (cpu tensor?)")."""
    kernels = {id(kernel) for kernel in jit_kernels(module)}
    if not kernels:
        return bindings(module)
    return assignments(walk(module, prune=lambda node: id(node) in kernels))


def pointer_problems(module: cst.Module) -> list[str]:
    """Pointers and tensors handed to kernels that cannot be the recorded ones."""
    bound = host_bindings(module)
    problems = []

    def on_cpu(name: str) -> bool:
        values = bound.get(name, [])
        return bool(values) and all(builds_on_cpu(v) for v in values)

    for node in walk(module):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
            continue
        if node.func.attr.value != "data_ptr":
            continue
        owner = node.func.value
        if not isinstance(owner, (cst.Name, cst.Attribute)):
            problems.append(f"the pointer of a temporary: {_code(node)}")
        elif isinstance(owner, cst.Name) and on_cpu(owner.value):
            problems.append(f"a CPU tensor's pointer: {_code(node)}")
    for launch in launches(module):
        for arg in launch.args:
            if isinstance(arg, cst.Name) and on_cpu(arg.value):
                problems.append(f"a CPU tensor handed to {launch.kernel}: {arg.value}")
            elif builds_on_cpu(arg):
                problems.append(f"a CPU tensor handed to {launch.kernel}: {_code(arg)}")
    return problems


def device_moves(module: cst.Module) -> list[str]:
    """`.cpu()`, `.to("cpu")`, `device="cpu"`: each a tensor that may leave its device."""
    moves = []
    for node in walk(module):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value == "cpu" or (
                node.func.attr.value == "to" and node.args and _is_cpu_string(node.args[0].value)
            ):
                moves.append(_code(node))
        elif (
            isinstance(node, cst.Arg)
            and node.keyword
            and node.keyword.value == "device"
            and _is_cpu_string(node.value)
        ):
            moves.append(_code(node))
    return moves


def calls_op(text: str, qualified: str, registering_names: Iterable[str]) -> bool:
    """`torch.ops.ns.op(...)` or a call of the Python function that registers it."""
    namespace, op = qualified.split("::")
    if f"torch.ops.{namespace}.{op}" in text:
        return True
    return any(re.search(rf"(?<!def )\b{re.escape(n)}\s*\(", text) for n in registering_names)


@dataclass(frozen=True, slots=True)
class Rules:
    """Which rules apply: the pointer and device rules to memory faults on the GPU, the
    custom-op rule when the failing op is one (`ns::op`)."""

    memory_fault: bool = False
    custom_op: str | None = None
    op_functions: tuple[str, ...] = ()  # Python names that register or wrap it
    focus: str | None = None  # the failing line: a candidate must not raise before its call

    def violations(self, code: str, extra: str = "", pass_name: str = "") -> Counter[str]:
        """What the candidate breaks (`extra`: the sibling modules it still imports)."""
        found: Counter[str] = Counter()
        for group in self._groups(code, extra, pass_name):
            found.update(group)
        return found

    def _groups(self, code: str, extra: str, pass_name: str) -> Iterator[Iterable[str]]:
        """The violations rule by rule, the rules that reject most candidates first (on the
        H200's reductions, a name read before it is bound: half the candidates the rules
        reject), each read only when asked for."""
        module = parse(code)
        if module is None:
            return
        yield raises_before_the_call(module, self.focus)
        yield refused_arguments(module, self.focus)
        yield uncompilable_kernels(module)
        yield mistyped_kernels(module)
        if not seeds_its_randomness(module):
            yield (UNSEEDED,)
        if self.memory_fault:
            yield pointer_problems(module)
            yield (f"moved off its device: {m}" for m in device_moves(module))
            yield faultless_launches(module, self.focus)
            if pass_name not in RESHAPING_PASSES:  # literal grids and blocks only: a name's
                yield (  # value is the sanitizer's to judge
                    f"launch {la.kernel}[{la.config}]"
                    for la in launches(module)
                    if not re.search(r"[A-Za-z_]", la.config)
                )
        yield invalid_configurations(module)
        if self.custom_op:
            text = f"{code}\n{extra}"
            if not registers(text, self.custom_op):
                yield (f"{self.custom_op} no longer registered",)
            if not calls_op(text, self.custom_op, self.op_functions):
                yield (f"{self.custom_op} no longer called",)

    def rejects(self, candidate: str, best: str, *, extra: tuple[str, str] = ("", ""),
                pass_name: str = "") -> list[str]:  # fmt: skip
        """The rules the candidate breaks that the best keeps (a launch whose grid or block
        changed shows as one the best does not make). `extra`: (candidate's, best's) siblings."""
        mine = self.violations(candidate, extra[0], pass_name)
        theirs = _best_violations(self, best, extra[1], pass_name)
        broken = [
            v for v, n in mine.items() if n > theirs.get(v, 0) and not v.startswith("launch ")
        ]
        return broken + self._launches_broken(candidate, best, mine, theirs)

    def first_broken(self, candidate: str, best: str, *, extra: tuple[str, str] = ("", ""),
                     pass_name: str = "") -> str | None:  # fmt: skip
        """`rejects(...)[0]` (None: nothing broken), reading the candidate's rules one at a
        time and stopping at the first it breaks: the reducer asks it of every candidate, and
        most are rejected by the first rule or two."""
        theirs = _best_violations(self, best, extra[1], pass_name)
        mine: Counter[str] = Counter()
        for group in self._groups(candidate, extra[0], pass_name):
            added = Counter(group)
            mine.update(added)
            for v in added:
                if mine[v] > theirs.get(v, 0) and not v.startswith("launch "):
                    return v
        return next(iter(self._launches_broken(candidate, best, mine, theirs)), None)

    def _launches_broken(
        self, candidate: str, best: str, mine: Counter[str], theirs: Counter[str]
    ) -> list[str]:
        """Launches whose configuration the best makes otherwise, and CuPy launches whose
        arrays stopped being arrays or that lost arguments."""
        launched = {v for v in mine if v.startswith("launch ")}
        before = {v for v in theirs if v.startswith("launch ")}
        kernels = {v.split("[", 1)[0] for v in before}
        broken = [v for v in launched - before if v.split("[", 1)[0] in kernels]
        if "(" in candidate:  # a CuPy launch's arrays stay arrays
            mine_module, best_module = parse(candidate), parse(best)
            if mine_module is not None and best_module is not None:
                broken += unwrapped_arrays(mine_module, best_module)
                broken += short_launches(mine_module, best_module)
        return broken


@lru_cache(maxsize=16)
def _best_violations(rules: Rules, best: str, extra: str, pass_name: str) -> Counter[str]:
    """The best's violations, read only: the best changes seldom, every candidate is held
    against it."""
    return rules.violations(best, extra, pass_name)


def sibling_paths(code: str, search_dirs: Sequence[Path]) -> Iterator[Path]:
    """The files of the user's modules `code` imports (not inlined yet)."""
    module = parse(code)
    if module is None:
        return
    for line in sibling_imports(module, search_dirs):
        name = import_module_name(line.body[0])
        path = None if name is None else sibling_file(name, search_dirs)
        if path is not None:
            yield path


def sibling_text(code: str, search_dirs: tuple[Path, ...]) -> str:
    """The text of the user's modules `code` still imports (not inlined yet)."""
    return "\n".join(path.read_text() for path in sibling_paths(code, search_dirs))


def sets_environment(code: str, search_dirs: tuple[Path, ...]) -> bool:
    """Could `code` (or a module of the user's it imports) set the environment before it
    starts CUDA? Then its check needs a child whose CUDA context is not made yet."""
    if SETS_ENVIRONMENT.search(code):
        return True
    return bool(SETS_ENVIRONMENT.search(sibling_text(code, search_dirs)))


def reducible_files(script_path: Path, search_dirs: Sequence[Path]) -> set[Path]:
    """The script and the sibling modules it imports: the code the reducer edits."""
    paths = sibling_paths(script_path.read_text(), search_dirs)
    return {script_path.resolve(), *(path.resolve() for path in paths)}
