"""Static validity rules: candidates that cannot be the user's bug are never run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Generator
from typing import Any

import libcst as cst
import pytest
import torch

from reprocut.model.case import Signature
from reprocut.source.fixed_point import SourceReducer
from reprocut.source.passes import PassContext
from reprocut.source.passes.launches import integer
from reprocut.source.validity import Rules, builds_on_cpu, launches

ILLEGAL = Signature("RuntimeError", 700, None, "an illegal memory access was encountered")
MEMORY = Rules(memory_fault=True)

# a stand-in for a CuPy launch: `kernel(grid, block, (pointers...))`
BEST = """\
import torch

def kernel(grid, block, args):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")

ids = torch.randint(0, 1 << 20, (64,), device="cuda")
table = torch.randn(1000, 16, device="cuda")
out = torch.empty(64, 16, device="cuda")
kernel((64,), (16,), (ids.data_ptr(), table.data_ptr(), out.data_ptr(), 1000))
"""


def _variant(old: str, new: str) -> str:
    assert old in BEST
    return BEST.replace(old, new)


def test_a_cpu_tensors_pointer_handed_to_a_launch_is_rejected() -> None:
    candidate = _variant('out = torch.empty(64, 16, device="cuda")', "out = torch.empty(64, 16)")
    assert MEMORY.rejects(candidate, BEST) == ["a CPU tensor's pointer: out.data_ptr()"]


def test_a_temporarys_pointer_is_rejected() -> None:
    candidate = _variant("out.data_ptr()", 'torch.empty(64, 16, device="cuda").data_ptr()')
    broken = MEMORY.rejects(candidate, BEST)
    assert broken == ['the pointer of a temporary: torch.empty(64, 16, device="cuda").data_ptr()']


def test_moving_a_tensor_off_its_device_and_changing_the_grid_are_rejected() -> None:
    moved = _variant("ids.data_ptr()", "ids.cpu().data_ptr()")
    assert "moved off its device: ids.cpu()" in MEMORY.rejects(moved, BEST)
    regridded = _variant("kernel((64,), (16,)", "kernel((1,), (16,)")
    assert MEMORY.rejects(regridded, BEST) == ["launch kernel[(1,), (16,)]"]


def test_the_first_broken_rule_is_the_first_that_rejects_lists() -> None:
    """The reducer asks `first_broken`, which stops at the first rule broken; it must name
    what `rejects` would name first, and nothing where `rejects` finds nothing."""
    from reprocut.source.passes import PASSES, candidates

    focus = "kernel((64,), (16,), (ids.data_ptr(), table.data_ptr(), out.data_ptr(), 1000))"
    rules = Rules(memory_fault=True, focus=focus)
    context = PassContext(focus=focus, memory_fault=True)
    made = [c for p in PASSES for c in candidates(p, BEST, context) if c is not None]
    made += [
        _variant("ids.data_ptr()", "ids.cpu().data_ptr()"),
        _variant("kernel((64,), (16,)", "kernel((1,), (16,)"),
        _variant('out = torch.empty(64, 16, device="cuda")', "out = torch.empty(64, 16)"),
    ]
    answers = [(rules.first_broken(c, BEST), rules.rejects(c, BEST)) for c in made]
    assert all(first == (listed[0] if listed else None) for first, listed in answers)
    assert sum(first is not None for first, _ in answers) >= 5  # rules were broken, and named


def test_a_smaller_table_or_fewer_rows_on_the_device_are_allowed() -> None:
    smaller = _variant("torch.randn(1000, 16,", "torch.randn(10, 16,")
    assert MEMORY.rejects(smaller, BEST) == []
    assert Rules().rejects(_variant("out = torch.empty(64, 16, device=\"cuda\")",
                                    "out = torch.empty(64, 16)"), BEST) == []  # fmt: skip


def test_a_cpu_tensor_as_a_triton_argument_is_rejected() -> None:
    best = 'x = torch.ones(8, device="cuda")\nadd_one[(1,)](x, 8)\n'
    candidate = "x = torch.ones(8)\nadd_one[(1,)](x, 8)\n"
    assert MEMORY.rejects(candidate, best) == ["a CPU tensor handed to add_one: x"]
    (launch,) = launches(cst.parse_module(best))
    assert (launch.kernel, launch.config) == ("add_one", "(1,)")
    assert builds_on_cpu(cst.parse_expression('x.to("cpu")'))
    assert not builds_on_cpu(cst.parse_expression("torch.zeros(3, device=x.device)"))


def test_a_cpu_tensor_is_rejected_though_the_kernel_binds_its_name_too() -> None:
    """The kernel's own `x = tl.load(x_ptr)` is a device value, not what the host hands the
    launch: the script's `x`, built on the CPU, is (the H200's expand_bias ran two such
    candidates, which Triton refused: "Pointer argument cannot be accessed from Triton")."""
    kernel = (
        "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def add_cond_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK\n    x = tl.load(x_ptr + offs)\n"
        "    tl.store(o_ptr + offs, x)\n\n\n"
    )
    best = kernel + (
        'x = torch.randn((256, 4096), device="cuda:0")\nn = x.numel()\n'
        'add_cond_kernel[(n,)](x, torch.empty(8, device="cuda:0"), n, BLOCK=1024)\n'
    )
    candidate = best.replace(
        'torch.randn((256, 4096), device="cuda:0")', "torch.randn((256, 4096))"
    )
    assert MEMORY.rejects(best, best) == []
    assert MEMORY.rejects(candidate, best) == ["a CPU tensor handed to add_cond_kernel: x"]


def test_a_custom_op_must_stay_registered_and_called() -> None:
    rules = Rules(custom_op="demo::f", op_functions=("f",))
    best = '@torch.library.custom_op("demo::f", mutates_args=())\ndef f(x): raise E\nf(x)\n'
    assert rules.rejects("raise E\n", best) == ["demo::f no longer registered",
                                                "demo::f no longer called"]  # fmt: skip
    assert rules.rejects(best.replace("f(x)\n", "raise E\n"), best) == ["demo::f no longer called"]


def test_the_reducer_never_runs_a_candidate_the_rules_reject() -> None:
    """Every candidate of the stand-in 'fails the same way'; only the valid one is taken."""
    checked: list[str] = []
    bad = _variant('out = torch.empty(64, 16, device="cuda")', "out = torch.empty(64)")
    good = _variant("torch.randn(1000, 16,", "torch.randn(10, 16,")

    def check(code: str) -> Signature:
        checked.append(code)
        return ILLEGAL

    def offer(best: str, context: PassContext) -> Generator[str, Any, None]:
        yield bad
        yield good

    reducer = SourceReducer(best=BEST, expected=ILLEGAL, check=check, context=PassContext(),
                            passes=(offer,), rules=MEMORY)  # fmt: skip
    reducer.run()
    assert bad not in checked
    assert reducer.best == good
    assert reducer.rejected == {"a CPU tensor's pointer: out.data_ptr()": 1}


def test_a_cupy_launch_whose_arguments_are_bound_to_a_name_is_checked() -> None:
    """As the hashed-ids kernel launches: `args = (cupy.asarray(ids), ...)`, `k(grid, block, args)`."""
    best = (
        'ids = torch.randint(0, 9, (4, 2), device="cuda")\n'
        'out = torch.empty(4, 8, device="cuda")\n'
        "args = (cupy.asarray(ids), cupy.asarray(out), np.int32(4))\n"
        "_KERNEL((1,), (128,), args)\n"
    )
    on_cpu = best.replace(
        'torch.randint(0, 9, (4, 2), device="cuda")', "torch.randint(0, 9, (4, 2))"
    )
    assert MEMORY.rejects(on_cpu, best) == ["a CPU tensor handed to _KERNEL: ids"]
    regridded = best.replace("_KERNEL((1,), (128,), args)", "_KERNEL((1,), (1,), args)")
    assert MEMORY.rejects(regridded, best) == ["launch _KERNEL[(1,), (1,)]"]


def test_a_seed_the_best_has_stays_while_random_tensors_are_drawn() -> None:
    """On the H200 an unseeded candidate's index tensor spanning 2**33 rows faulted with error
    700 in the fork and 717 in the plain runs: random tensors must draw the same values."""
    seeded = _variant("import torch\n", "import torch\ntorch.manual_seed(0)\n")
    assert Rules().rejects(BEST, seeded) == ["random tensors without a seed"]
    assert MEMORY.rejects(BEST, seeded) == ["random tensors without a seed"]
    # the best drew unseeded values already (the user's own script): nothing to keep
    assert Rules().rejects(_variant("out = torch.empty", "out = torch.zeros"), BEST) == []
    # nothing random left: the seed may go too
    plain = 'import torch\nids = torch.full((64,), 1 << 20, device="cuda")\nids.sum()\n'
    assert Rules().rejects(plain, seeded) == []


def test_a_launch_configuration_stays_valid() -> None:
    """Grid and block dims of 1 or more, at most 1024 threads a block, as far as the script
    fixes them (names assigned once are followed; `rows` from a shape is not)."""
    best = (
        "rows, threads = x.shape[0], 256\n"
        "block = threads\n"
        "ROWSUM((rows,), (block,), (x.data_ptr(), rows))\n"
    )
    zero = best.replace("(block,)", "(0,)")
    assert Rules().rejects(zero, best) == ["invalid launch: ROWSUM block (0,) has a dim below 1"]
    assert MEMORY.rejects(zero, best) == ["invalid launch: ROWSUM block (0,) has a dim below 1"]
    named = "threads = 0\nROWSUM((4,), (threads,), (x, 4))\n"
    assert Rules().rejects(named, named.replace("threads = 0", "threads = 256")) == [
        "invalid launch: ROWSUM block (threads,) has a dim below 1"
    ]
    wide = best.replace("block = threads", "block = threads * 8")
    assert Rules().rejects(wide, best) == [
        "invalid launch: ROWSUM block (block,) is 2048 threads, over 1024"
    ]
    assert Rules().rejects(best.replace("(block,)", "(32, 32)"), best) == []  # 1024 is the most
    triton = "add_one[(n // 4, 0)](x, n)\n"
    assert Rules().rejects(triton, "add_one[(n // 4, 1)](x, n)\n") == [
        "invalid launch: add_one grid (n // 4, 0) has a dim below 1"
    ]
    assert Rules().rejects(best, best) == []  # what the script fixes nowhere is not judged


def test_a_grid_over_cudas_limits_or_a_cdiv_short_of_its_divisor_is_rejected() -> None:
    """What the last round of cuda_triton_int32_offsets offered on the H200: `grid = (n,)` and
    `(triton.cdiv(n, 1),)` for `(triton.cdiv(n, 2),)` with n = 2.49 G (a grid x over 2**31 - 1
    is refused), `triton.cdiv(n)`. CuPy wraps x modulo 2**32: only the span below is sure."""
    best = "n = 2489319424\ngrid = (triton.cdiv(n, 2),)\nk[grid](x, n)\n"
    over = ["invalid launch: k grid grid is over CUDA's grid limits"]
    assert Rules().rejects(best, best) == []
    assert Rules().rejects(best.replace("triton.cdiv(n, 2)", "n"), best) == over
    assert Rules().rejects(best.replace("cdiv(n, 2)", "cdiv(n, 1)"), best) == over
    assert Rules().rejects(best.replace("(triton.cdiv(n, 2),)", "(1, 65536)"), best) == over
    assert Rules().rejects(best.replace("cdiv(n, 2)", "cdiv(n)"), best) == [
        "TypeError: triton.cdiv() without its 2 argument(s)"
    ]
    cupy = "K((n,), (1,), (x, n))\n"
    for n, expected in (("2489319424", over[0].replace("k grid grid", "K grid (n,)")),
                        ("4294967296", None)):  # fmt: skip
        candidate = f"n = {n}\n{cupy}"
        got = Rules().rejects(candidate, "n = 7\n" + cupy)
        assert got == ([expected] if expected else []), n


def test_a_grid_of_a_factory_tensors_numel_is_known() -> None:
    """The H200's int32_offsets at 8257a0d: `n` was the logits' `numel()`, so `grid = (n,)` for
    `(triton.cdiv(n, 1024),)` went unjudged and raised OverflowError three times."""
    logits = "torch.randn((8, 2048, 151936), dtype=torch.bfloat16, device='cuda:0')"
    best = f"n = {logits}.numel()\ngrid = (triton.cdiv(n, 1024),)\nk[grid](x, n)\n"
    assert Rules().rejects(best, best) == []
    assert Rules().rejects(best.replace("(triton.cdiv(n, 1024),)", "(n,)"), best) == [
        "invalid launch: k grid grid is over CUDA's grid limits"
    ]
    bound = {"x": [cst.parse_expression("torch.zeros(8, 2048)")]}
    assert integer(cst.parse_expression("x.numel()"), bound) == 8 * 2048
    assert integer(cst.parse_expression("torch.full((4, 4), 7).numel()"), {}) == 16
    for unknown in ("torch.arange(16).numel()", "x.expand(4, 8, 2048).numel()", "y.numel()"):
        assert integer(cst.parse_expression(unknown), bound) is None, unknown


# --- what raises before the failing call (reprocut.source.doomed) ------------------------------

FOCUS = "kernel((64,), (16,), (ids.data_ptr(), table.data_ptr(), out.data_ptr(), 1000))"


def test_a_name_read_before_any_statement_binds_it_is_rejected_unrun() -> None:
    rules = Rules(memory_fault=True, focus=FOCUS)
    assert rules.rejects(BEST, BEST) == []
    deleted = _variant('out = torch.empty(64, 16, device="cuda")\n', "")
    assert rules.rejects(deleted, BEST) == ["NameError: out"]
    # read by an earlier statement, bound only later: it raises there
    swapped = _variant('table = torch.randn(1000, 16, device="cuda")\n', "").replace(
        'out = torch.empty(64, 16, device="cuda")\n',
        'out = torch.empty(64, table.shape[1], device="cuda")\ntable = torch.randn(1000, 16, device="cuda")\n',
    )
    assert rules.rejects(swapped, BEST) == ["NameError: table"]


def test_names_read_after_the_failing_call_or_bound_unseen_are_left_to_the_run() -> None:
    rules = Rules(focus=FOCUS)
    after = BEST + "print(result)\n"  # the failing call raises first
    assert rules.rejects(after, BEST) == []
    for unseen in ("from helpers import *\n", "globals()['out'] = None\n"):
        dynamic = _variant("import torch\n", "import torch\n" + unseen).replace(
            'out = torch.empty(64, 16, device="cuda")\n', ""
        )
        assert rules.rejects(dynamic, BEST) == [], unseen
    # a block may bind what it mentions; a function's body does not run at its definition
    branch = _variant('out = torch.empty(64, 16, device="cuda")\n',
                      'if ids.numel():\n    out = torch.empty(64, 16, device="cuda")\n')  # fmt: skip
    assert rules.rejects(branch, BEST) == []
    inside = "import torch\n\ndef main():\n    kernel(grid)\n\nmain()\n"
    assert Rules(focus="kernel(grid)").rejects(inside, inside.replace("import torch\n", "")) == []


def test_a_name_bound_to_a_literal_and_used_as_no_literal_allows_is_rejected_unrun() -> None:
    """simplify_expressions' `ids = 0` or `= None`: the launch then reads `ids.data_ptr()`."""
    rules = Rules(focus=FOCUS)
    zero = _variant('ids = torch.randint(0, 1 << 20, (64,), device="cuda")', "ids = 0")
    assert rules.rejects(zero, BEST) == ["AttributeError: int ids.data_ptr"]
    indexed = _variant('out = torch.empty(64, 16, device="cuda")',
                       'out = None\nrows = out[0]')  # fmt: skip
    assert rules.rejects(indexed, BEST) == [
        "TypeError: out (NoneType) indexed",
        "AttributeError: NoneType out.data_ptr",
    ]
    called = _variant('table = torch.randn(1000, 16, device="cuda")',
                      'table = torch.randn(1000, 16, device="cuda")\nmake = ()\nmake()')  # fmt: skip
    assert rules.rejects(called, BEST) == ["TypeError: make (tuple) called"]
    # what such a value allows, or a name bound again since, is left to the run
    allowed = _variant("import torch\n", 'import torch\nname = "ids"\nkey = name.upper()[0]\n')
    assert rules.rejects(allowed, BEST) == []
    again = _variant("ids = torch.randint(", "ids = 0\nids = torch.randint(")
    assert rules.rejects(again, BEST) == []
    inside = _variant("import torch\n", "import torch\nn = 0\nf = lambda: n.shape\n")
    assert rules.rejects(inside, BEST) == []  # a lambda's body runs later, if at all


def test_a_name_bound_to_a_tensors_count_is_an_int() -> None:
    """A hoist made `out = torch.empty(ids.numel(), ...)` into `out = ids.numel()` (the H200's
    host_pointers, twice at 8257a0d): the launch's `out.data_ptr()` then raises."""
    rules = Rules(focus=FOCUS)
    for count in ("ids.numel()", "ids.size(0)", "table.stride(0)", "ids.dim()"):
        hoisted = _variant('out = torch.empty(64, 16, device="cuda")', f"out = {count}")
        assert rules.rejects(hoisted, BEST) == ["AttributeError: int out.data_ptr"], count
    # a shape is no int (`.size()` with no dim is a torch.Size), and an int may be used as one
    out = 'out = torch.empty(64, 16, device="cuda")'
    shape = _variant(out, f"{out}\nshape = table.size()\nn = shape.numel()")
    assert rules.rejects(shape, BEST) == []
    counted = _variant("1000))", "ids.numel() * 2))")
    assert rules.rejects(counted, BEST) == []


def test_a_factory_or_a_tensor_method_missing_its_size_is_rejected_unrun() -> None:
    rules = Rules()
    no_size = _variant('torch.randn(1000, 16, device="cuda")', 'torch.randn(device="cuda")')
    assert rules.rejects(no_size, BEST) == ["TypeError: torch.randn() without its 1 argument(s)"]
    sized = _variant(
        'torch.randn(1000, 16, device="cuda")', 'torch.randn(size=(9,), device="cuda")'
    )
    assert rules.rejects(sized, BEST) == []  # `size=` is its size
    bare = _variant('torch.randn(1000, 16, device="cuda")', "torch.randn()")
    assert rules.rejects(bare, BEST) == ["TypeError: torch.randn() without its 1 argument(s)"]
    view = _variant("table.data_ptr()", "table.as_strided((4,)).data_ptr()")
    assert rules.rejects(view, BEST) == ["TypeError: table.as_strided() without its 2 argument(s)"]
    keyworded = _variant("torch.randint(0, 1 << 20, (64,)", "torch.randint(high=9, size=(64,)")
    assert rules.rejects(keyworded, BEST) == []
    # the size of torch.randint and torch.full must be a sequence: a number there raises
    dropped = _variant("torch.randint(0, 1 << 20, (64,)", "torch.randint(0, 1 << 20")
    assert rules.rejects(dropped, BEST) == []  # `1 << 20` is no literal: left to the run
    literal = _variant("torch.randint(0, 1 << 20, (64,)", "torch.randint(0, 64")
    assert rules.rejects(literal, BEST) == [
        "TypeError: torch.randint() given a number for its size"
    ]
    assert rules.rejects(_variant("torch.randint(0, 1 << 20, (64,)", "torch.randint(9, (64,)"),
                         BEST) == []  # fmt: skip
    full = _variant('torch.randn(1000, 16, device="cuda")', 'torch.full(1000, 1.0, device="cuda")')
    assert rules.rejects(full, BEST) == ["TypeError: torch.full() given a number for its size"]
    for text in ("torch.randint(0, 64)", "torch.full(1000, 1.0)"):  # what torch itself says
        with pytest.raises(TypeError):
            eval(text, {"torch": torch})


CUPY_BEST = """\
import cupy
import torch

x = torch.randn(64, device="cuda")
out = torch.empty_like(x)
args = (cupy.asarray(x), cupy.asarray(out), 64)
KERNEL((1,), (64,), args)
"""


def test_a_cupy_launch_keeps_its_arrays_wrapped() -> None:
    rules = Rules(memory_fault=True, focus="KERNEL((1,), (64,), args)")
    for bare in ("x", "cupy", 'torch.randn(64, device="cuda")'):
        candidate = CUPY_BEST.replace("cupy.asarray(x)", bare)
        assert rules.rejects(candidate, CUPY_BEST) == [
            "TypeError: KERNEL argument 0 is no CuPy array"
        ]
    scalar = CUPY_BEST.replace(", 64)\n", ", n)\n").replace("args =", "n = 64\nargs =")
    assert rules.rejects(scalar, CUPY_BEST) == []  # a scalar was never wrapped
    short = CUPY_BEST.replace("KERNEL((1,), (64,), args)", "KERNEL((1,), (64,))")
    assert rules.rejects(short, CUPY_BEST) == [
        "TypeError: KERNEL launched without its grid, block and args"
    ]


def test_a_failing_call_whose_callee_is_bound_to_a_module_or_a_literal_is_rejected_unrun() -> None:
    """Hoisting a RawKernel's source string out of its call, or the call down to `cupy`,
    leaves `KERNEL(...)` calling a str or a module."""
    made = 'KERNEL = cupy.RawKernel(SOURCE, "rows")\n'
    best = CUPY_BEST.replace("x = torch", 'SOURCE = "..."\n' + made + "x = torch")
    rules = Rules(memory_fault=True, focus="KERNEL((1,), (64,), args)")
    assert rules.rejects(best, best) == []
    assert rules.rejects(best.replace(made, "KERNEL = SOURCE\n"), best) == [
        "TypeError: KERNEL is a literal"  # SOURCE is one
    ]
    assert (
        rules.rejects(
            best.replace(made, 'KERNEL = cupy.RawModule(code=SOURCE).get_function("rows")\n'), best
        )
        == []
    )  # a call's value: unknown
    assert rules.rejects(best.replace(made, 'KERNEL = "..."\n'), best) == [
        "TypeError: KERNEL is a literal"
    ]
    assert rules.rejects(best.replace(made, "KERNEL = cupy\n"), best) == [
        "TypeError: KERNEL is a module"
    ]
    assert rules.rejects(best.replace(made, "KERNEL = cupy.RawKernel(SOURCE)\n"), best) == [
        "TypeError: cupy.RawKernel() without its 2 argument(s)"
    ]


TRITON_BEST = """\
import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:

    @triton.jit
    def add_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        for k in range(2):
            offs = offs + k
        tl.store(o_ptr + offs, tl.load(x_ptr + offs))

x = torch.randn(64, device="cuda")
out = torch.empty_like(x)
add_kernel[(4,)](x, out, 64, BLOCK=16)
"""


def test_a_triton_kernel_reading_a_name_nothing_binds_is_rejected_unrun() -> None:
    """A @triton.jit body is compiled at its launch, the failing call: a name nothing binds
    raises a compile error there instead of the fault."""
    rules = Rules(memory_fault=True, focus="add_kernel[(4,)](x, out, 64, BLOCK=16)")
    assert rules.rejects(TRITON_BEST, TRITON_BEST) == []
    no_pid = TRITON_BEST.replace("        pid = tl.program_id(0)\n", "")
    assert rules.rejects(no_pid, TRITON_BEST) == ["NameError: pid in kernel add_kernel"]
    # a parameter, a loop target and the module's guarded imports bind what they name
    no_loop = TRITON_BEST.replace("        for k in range(2):\n            offs = offs + k\n", "")
    assert rules.rejects(no_loop, TRITON_BEST) == []
    no_param = TRITON_BEST.replace("x_ptr, o_ptr, n,", "o_ptr, n,").replace(
        "add_kernel[(4,)](x, out,", "add_kernel[(4,)](out,"
    )
    focus = "add_kernel[(4,)](out, 64, BLOCK=16)"
    assert Rules(memory_fault=True, focus=focus).rejects(no_param, TRITON_BEST) == [
        "NameError: x_ptr in kernel add_kernel"
    ]
    plain = TRITON_BEST.replace("    @triton.jit\n", "")  # a plain function runs when called
    assert rules.rejects(plain.replace("        pid = tl.program_id(0)\n", ""), plain) == []


def test_a_triton_kernel_that_cannot_compile_or_a_launch_short_of_a_parameter_is_rejected() -> None:
    """What ended 87 of 172 checks of a Triton reduction on the H200 in a CompilationError or a
    TypeError at the launch: a call hoisted to its module, a `tl` function short of an
    argument, a launch without one of the kernel's parameters."""
    rules = Rules(memory_fault=True, focus="add_kernel[(4,)](x, out, 64, BLOCK=16)")
    hoisted = TRITON_BEST.replace("tl.arange(0, BLOCK)", "tl")
    assert rules.rejects(hoisted, TRITON_BEST) == [
        "CompilationError: module tl as a value in kernel add_kernel"
    ]
    short = TRITON_BEST.replace("tl.arange(0, BLOCK)", "tl.arange(0)")
    assert rules.rejects(short, TRITON_BEST) == [
        "CompilationError: tl.arange() without its 2 argument(s) in kernel add_kernel"
    ]
    unmasked = TRITON_BEST.replace("tl.load(x_ptr + offs)", "tl.load(x_ptr + offs, mask=None)")
    assert rules.rejects(unmasked, TRITON_BEST) == []  # keywords count, defaults may go
    for launch in ("add_kernel[(4,)](x, out, 64)", "add_kernel[(4,)](x, out, BLOCK=16)"):
        unpassed = TRITON_BEST.replace("add_kernel[(4,)](x, out, 64, BLOCK=16)", launch)
        missing = "BLOCK" if "BLOCK" not in launch else "n"
        got = Rules(memory_fault=True, focus=launch).rejects(unpassed, TRITON_BEST)
        assert got == [f"TypeError: add_kernel launched without {missing}"], launch
    # an autotuned kernel takes parameters from its configs: its launches are left to the run
    tuned = TRITON_BEST.replace("    @triton.jit\n", "    @triton.autotune(configs=[], key=[])\n    @triton.jit\n")  # fmt: skip
    short_tuned = tuned.replace("x, out, 64, BLOCK=16)", "x, out, 64)")
    assert Rules(focus="add_kernel[(4,)](x, out, 64)").rejects(short_tuned, tuned) == []


def test_a_decorator_reading_a_deleted_import_or_a_cpu_view_handed_to_a_kernel_is_rejected() -> (
    None
):
    """`@triton.jit` reads `triton` when the `def` runs; `torch.randn(n).as_strided(...)` is a
    CPU tensor however it is viewed (Triton: "Pointer argument cannot be accessed")."""
    flat = TRITON_BEST.replace(
        "try:\n    import triton\n    import triton.language as tl\nexcept ImportError:\n    triton = None\n\nif triton is not None:\n\n",
        "import triton\nimport triton.language as tl\n\n",
    ).replace("\n    ", "\n")
    rules = Rules(memory_fault=True, focus="add_kernel[(4,)](x, out, 64, BLOCK=16)")
    assert rules.rejects(flat, flat) == []
    assert rules.rejects(flat.replace("import triton\n", "", 1), flat) == ["NameError: triton"]
    view = 'torch.randn(4096, device="cuda").as_strided((64,), (0,))'
    best = flat.replace('x = torch.randn(64, device="cuda")', f"x = {view}")
    on_cpu = best.replace('torch.randn(4096, device="cuda")', "torch.randn(4096)")
    assert rules.rejects(best, best) == []
    assert rules.rejects(on_cpu, best) == ["a CPU tensor handed to add_kernel: x"]


def test_a_kernels_attribute_names_keywords_and_one_line_bodies_are_not_read_as_values() -> None:
    """`tl.math.exp`'s `math` is an attribute's name even where `import math` binds a module,
    `mask=` a keyword; a one-line kernel binds what its statements assign."""
    rules = Rules(memory_fault=True, focus="add_kernel[(4,)](x, out, 64, BLOCK=16)")
    best = "import math\n" + TRITON_BEST.replace(
        "tl.load(x_ptr + offs)", "tl.math.exp(tl.load(x_ptr + offs, mask=offs < n))"
    )
    assert rules.rejects(best, best) == []
    one_line = best.replace(
        "    def add_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):\n",
        "    def add_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr): pid = tl.program_id(0); tl.store(o_ptr + pid, 1.0)\n\n    def unused(x_ptr, o_ptr, n, BLOCK: tl.constexpr):\n",
    )  # fmt: skip
    assert rules.rejects(one_line, best) == []


def test_none_or_a_number_where_a_kernel_needs_a_value_or_a_pointer_is_rejected() -> None:
    """What simplify_expressions made of a Triton kernel on the H200 (30 of one reduction's 42
    candidates, each a CompilationError after its CUDA start): `x = None`, `tl.load(0)`,
    `tl.store(None, v)`, `tl.store(p, None)`. A keyword's None and a plain 0 value are left."""
    rules = Rules(memory_fault=True, focus="add_kernel[(4,)](x, out, 64, BLOCK=16)")
    store = "tl.store(o_ptr + offs, tl.load(x_ptr + offs))"
    assert store in TRITON_BEST
    made = {
        "None assigned": TRITON_BEST.replace("pid = tl.program_id(0)", "pid = None"),
        "tl.load() of a constant, not a pointer": TRITON_BEST.replace(
            "tl.load(x_ptr + offs)", "tl.load(0)"
        ),
        "tl.store() of a constant, not a pointer": TRITON_BEST.replace(
            store, "tl.store(None, tl.load(x_ptr + offs))"
        ),
        "tl.store() of None": TRITON_BEST.replace(store, "tl.store(o_ptr + offs, None)"),
    }
    for why, candidate in made.items():
        assert rules.rejects(candidate, TRITON_BEST) == [
            f"CompilationError: {why} in kernel add_kernel"
        ]
    for fine in (
        "tl.store(o_ptr + offs, 0)",
        "tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=None))",
    ):
        assert rules.rejects(TRITON_BEST.replace(store, fine), TRITON_BEST) == [], fine


def test_a_load_of_no_parameter_or_a_kernel_called_without_its_grid_is_rejected() -> None:
    """A kernel's pointers come from its parameters: `tl.load(offs)` with `offs` made from
    `tl.program_id` cannot compile; `kernel(...)` without `[grid]` raises before any launch
    (hoist_subexpressions made both of a Triton fault script on the H200)."""
    rules = Rules(memory_fault=True, focus="add_kernel[(4,)](x, out, 64, BLOCK=16)")
    load = "tl.load(x_ptr + offs)"
    no_pointer = TRITON_BEST.replace(load, "tl.load(offs)")
    assert rules.rejects(no_pointer, TRITON_BEST) == [
        "CompilationError: tl.load() of no pointer in kernel add_kernel"
    ]
    derived = TRITON_BEST.replace(
        "offs = pid * BLOCK", "base = x_ptr + pid\n        offs = pid * BLOCK"
    )
    assert rules.rejects(derived.replace(load, "tl.load(base)"), derived) == []  # via a name
    ungridded = TRITON_BEST.replace(
        "add_kernel[(4,)](x, out, 64, BLOCK=16)", "add_kernel(x, out, 64, BLOCK=16)"
    )
    assert "RuntimeError: add_kernel called without a grid" in Rules(
        memory_fault=True, focus="add_kernel(x, out, 64, BLOCK=16)"
    ).rejects(ungridded, TRITON_BEST)


POINTERS_BEST = """\
import cupy
import torch

SOURCE = "..."
KERNEL = cupy.RawKernel(SOURCE, "gather_rows")
ids = torch.randint(0, 9, (512,), device="cuda")
out = ids
table = torch.randn((50000, 64), device="cuda")
n, dim = ids.numel(), table.shape[0]
rows, cols = table.shape
pointers = (ids.data_ptr(), table.data_ptr(), out.data_ptr(), n, dim)
KERNEL((n,), (1,), pointers)
"""


def test_a_torch_tensor_or_a_tuple_handed_to_a_cupy_launch_is_rejected_unrun() -> None:
    """What hoist_subexpressions made of `cuda_cupy_host_pointers` and `cuda_cupy_hashed_ids`
    every round on the H200 (their last rounds' six candidates): `RawKernel.__call__` passes
    arrays, scalars and None and raises "Unsupported type" for a torch tensor or a tuple,
    written there or through names."""
    rules = Rules(memory_fault=True, focus="KERNEL((n,), (1,), pointers)")
    assert rules.rejects(POINTERS_BEST, POINTERS_BEST) == []
    made = {  # the candidate's change: why it raises
        ("(ids.data_ptr(),", "(ids,"): "argument 0 is a torch tensor",
        ("table.data_ptr(), out", "table, out"): "argument 1 is a torch tensor",
        ("out.data_ptr(), n", "out, n"): "argument 2 is a torch tensor",  # out = ids
        ("ids.numel(), table", "ids, table"): "argument 3 is a torch tensor",  # n = ids
        ("table.shape[0]\n", "table.shape\n"): "argument 4 is a tuple",  # dim = table.shape
        ("ids.numel(), table", "ids.float().mean(), table"): "argument 3 is a torch tensor",
        ("ids.numel(), table", "ids[0], table"): "argument 3 is a torch tensor",
        ("ids.numel(), table", "ids * 2, table"): "argument 3 is a torch tensor",
    }
    for (old, new), why in made.items():
        candidate = POINTERS_BEST.replace(old, new, 1)
        assert rules.rejects(candidate, POINTERS_BEST) == [f"TypeError: KERNEL {why}"], new
    left = {
        "unpacked from a shape": POINTERS_BEST.replace(", n, dim)", ", rows, cols)"),
        "a scalar": POINTERS_BEST.replace("out.data_ptr(), n", "out.data_ptr(), 7"),
        "a scalar of a tensor": POINTERS_BEST.replace(
            "ids.numel(), table", "ids.sum().item(), table"
        ),
        "an element of a shape": POINTERS_BEST.replace(
            "ids.numel(), table", "ids.shape[0] * 2, table"
        ),
        "a name bound in a loop too": POINTERS_BEST.replace(
            "KERNEL(", "for out in (ids,):\n    pass\nKERNEL("
        ).replace("out.data_ptr(), n", "out, n"),
        "another kernel's launch": POINTERS_BEST + "OTHER((1,), (1,), (ids,))\n",
        "a launch in a function, reading its parameter": POINTERS_BEST.replace(
            "pointers = (", "def run(ids):\n    pointers = ("
        )
        .replace("KERNEL((n,), (1,), pointers)", "    KERNEL((n,), (1,), pointers)\nrun(7)")
        .replace("(ids.data_ptr(), table", "(ids, table"),
        "a function of the user's": POINTERS_BEST.replace(
            'KERNEL = cupy.RawKernel(SOURCE, "gather_rows")', "from kernels import KERNEL"
        ).replace("out.data_ptr(), n", "out, n"),
    }
    for why, candidate in left.items():
        assert rules.rejects(candidate, POINTERS_BEST) == [], why


TRITON_FLAT = """\
import torch
import triton
import triton.language as tl


@triton.jit
def add_cond_kernel(x_ptr, c_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x + c, mask=mask)


x = torch.randn((256, 4096), device="cuda")
out = torch.empty_like(x)
add_cond_kernel[(1024,)](x, torch.randn(4096, device="cuda").expand(256, 4096), out, x.numel(), BLOCK=1024)
"""
TRITON_FOCUS = (
    'add_cond_kernel[(1024,)](x, torch.randn(4096, device="cuda").expand(256, 4096), out, '
    "x.numel(), BLOCK=1024)"
)


def test_a_triton_kernel_left_storing_nothing_is_rejected_for_a_memory_fault() -> None:
    """A load nothing uses is compiled away: with its store deleted, or hoisted to its pointer,
    the kernel touches no memory (the last rounds of two Triton reductions on the H200 offered
    three such candidates). A kernel that still writes, or calls what may, is left to the run."""
    rules = Rules(memory_fault=True, focus=TRITON_FOCUS)
    assert rules.rejects(TRITON_FLAT, TRITON_FLAT) == []
    store = "    tl.store(o_ptr + offs, x + c, mask=mask)\n"
    why = ["no memory access: kernel add_cond_kernel stores nothing"]
    assert rules.rejects(TRITON_FLAT.replace(store, ""), TRITON_FLAT) == why
    assert rules.rejects(TRITON_FLAT.replace(store, "    o_ptr + offs\n"), TRITON_FLAT) == why
    wrapped = TRITON_FLAT.replace(store, "").replace(
        "add_cond_kernel[(1024,)]", "torch.library.wrap_triton(add_cond_kernel)[(1024,)]"
    )
    wrapped_focus = TRITON_FOCUS.replace(
        "add_cond_kernel[(1024,)]", "torch.library.wrap_triton(add_cond_kernel)[(1024,)]"
    )
    assert Rules(memory_fault=True, focus=wrapped_focus).rejects(wrapped, TRITON_FLAT) == why
    assert Rules(focus=TRITON_FOCUS).rejects(TRITON_FLAT.replace(store, ""), TRITON_FLAT) == []
    kept = {
        "an atomic": "    tl.atomic_add(o_ptr + offs, x + c, mask=mask)\n",
        "a helper that may store": "    store_sum(o_ptr + offs, x + c)\n",
        "a volatile load": "    x = tl.load(x_ptr + offs, volatile=True)\n",
        "a device assert": "    tl.device_assert(c == 0)\n",
        "a tensor method, then a store": "    tl.store(o_ptr + offs, (x + c).to(tl.float16))\n",
    }
    helper = "@triton.jit\ndef store_sum(p, v):\n    tl.store(p, v)\n\n\n"
    best = TRITON_FLAT.replace("@triton.jit\ndef add", helper + "@triton.jit\ndef add")
    for what, line in kept.items():
        candidate = best.replace(store, line)
        assert rules.rejects(candidate, best) == [], what


def _run_on_the_gpu(tmp_path, code: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "candidate.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip


TRITON_FAULT = TRITON_FLAT.replace(
    'x = torch.randn((256, 4096), device="cuda")',
    'x = torch.randn((256, 256, 4096), device="cuda")',
).replace(
    TRITON_FOCUS,
    'add_cond_kernel[(262144,)](x, torch.randn((256, 1, 4096), device="cuda").expand(256, 256, '
    "4096), out, x.numel(), BLOCK=1024)\ntorch.cuda.synchronize()",
)


@pytest.mark.cuda
def test_on_the_gpu_a_triton_kernel_storing_nothing_makes_no_fault_where_its_store_does(
    tmp_path,
) -> None:
    """The faultless rule's premise, on the device (corpus/cuda_triton_expand_bias's bug): an
    expanded tensor read as if contiguous, 1 GiB from 4 MiB of storage, faults when a store
    uses what it read, and touches nothing once the store is gone (the load is compiled away)."""
    pytest.importorskip("triton")
    store = "    tl.store(o_ptr + offs, x + c, mask=mask)\n"
    storeless = TRITON_FAULT.replace(store, "")
    focus = TRITON_FAULT.splitlines()[-2]
    assert Rules(memory_fault=True, focus=focus).rejects(storeless, TRITON_FAULT) == [
        "no memory access: kernel add_cond_kernel stores nothing"
    ]
    ran = _run_on_the_gpu(tmp_path, TRITON_FAULT)
    assert ran.returncode != 0 and "illegal memory access" in ran.stderr, ran.stderr[-2000:]
    ran = _run_on_the_gpu(tmp_path, storeless)
    assert ran.returncode == 0, ran.stderr[-2000:]


@pytest.mark.cuda
def test_on_the_gpu_a_cupy_launch_refuses_a_torch_tensor_or_a_tuple(tmp_path) -> None:
    """The CuPy rule's premise: `RawKernel.__call__` raises a TypeError for either argument."""
    pytest.importorskip("cupy")
    code = (
        "import cupy\nimport torch\n"
        "k = cupy.RawKernel('extern \"C\" __global__ void f(const float* x, int n) {}', 'f')\n"
        "x = torch.randn(4, device='cuda')\n"
        "k((1,), (1,), (cupy.asarray(x), 4))\n"
        "for bad in (x, x.shape):\n"
        "    try:\n"
        "        k((1,), (1,), (bad, 4))\n"
        "    except TypeError as e:\n"
        "        print('refused', type(bad).__name__, e)\n"
        "    else:\n"
        "        print('passed', type(bad).__name__)\n"
    )
    ran = _run_on_the_gpu(tmp_path, code)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.count("refused") == 2, ran.stdout


OFFSETS_BEST = """\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * scale)


n = 2489319424
grid = (triton.cdiv(n, 2),)
scale_kernel[grid](torch.randn((8, 2048, 151936), device="cuda"), torch.randn((8, 2048, 151936), device="cuda"), n, 1.0, BLOCK=2)
"""
OFFSETS_FOCUS = OFFSETS_BEST.splitlines()[-1]


def test_a_triton_kernel_whose_every_access_lands_inside_its_tensor_is_rejected() -> None:
    """A store and the loads it uses at constant offsets inside tensors the script sizes itself
    cannot fault (seven of the last rounds' candidates of two Triton reductions on the H200:
    `pid = 0`, `offs = BLOCK`, `tl.store(out_ptr, 0)`); an offset from `tl.program_id`, past
    the tensor's end or before its start, or a size the script does not spell out is the run's."""
    rules = Rules(memory_fault=True, focus=OFFSETS_FOCUS)
    assert rules.rejects(OFFSETS_BEST, OFFSETS_BEST) == []
    inside = ["no memory fault: every access of kernel scale_kernel lands in its tensor"]
    for old, new in (
        ("pid = tl.program_id(0)", "pid = 0"),
        ("offs = pid * BLOCK", "offs = BLOCK"),
        ("offs = pid * BLOCK", "offs = tl.arange(0, BLOCK) + 7"),
        ("tl.store(out_ptr + offs, tl.load(x_ptr + offs) * scale)", "tl.store(out_ptr, 0)"),
        (  # the load at program_id's offsets is dead: no value of it is stored
            "tl.store(out_ptr + offs, tl.load(x_ptr + offs) * scale)",
            "c = tl.load(x_ptr + offs)\n    tl.store(out_ptr, scale)",
        ),
    ):
        candidate = OFFSETS_BEST.replace(old, new)
        assert rules.rejects(candidate, OFFSETS_BEST) == inside, new
    constant = OFFSETS_BEST.replace("offs = pid * BLOCK", "offs = BLOCK")  # out_ptr + 2
    small = 'torch.randn((8, 2048, 151936), device="cuda"), n'
    branch = "    pid = tl.program_id(0)\n    if tl.load(x_ptr + pid) > 0:\n        pid = 0\n"
    for why, candidate, expected in (
        # the best itself: pid * BLOCK reaches 2.49 G, past int32, where it wraps negative
        ("int32 wrapping", OFFSETS_BEST.replace("(8, 2048, 151936)", "(8, 2048, 151937)"), []),
        ("program_id's offsets inside", OFFSETS_BEST.replace("pid * BLOCK", "pid"), inside),
        ("program_id's offsets past the end", OFFSETS_BEST.replace("pid * BLOCK", "pid").replace(
            small, 'torch.randn(1000, device="cuda"), n'), []),
        ("a grid the script does not fix", OFFSETS_BEST.replace("pid * BLOCK", "pid").replace(
            "grid = (triton.cdiv(n, 2),)", "grid = lambda meta: (triton.cdiv(n, 2),)"), []),
        ("before the start", OFFSETS_BEST.replace("pid * BLOCK", "1 - BLOCK"), []),
        ("past the end", constant.replace(small, 'torch.randn(2, device="cuda"), n'), []),
        ("past a view's end", constant.replace(
            small, 'torch.randn(4, device="cuda").as_strided((2,), (1,), 2), n'), []),
        ("inside a view", constant.replace(
            small, 'torch.randn(4, device="cuda").as_strided((2,), (1,), 1), n'), inside),
        ("a pointer moved in the kernel", constant.replace(
            "    pid = tl.program_id(0)\n", "    pid = tl.program_id(0)\n    out_ptr = out_ptr - 9\n"), []),
        ("an integer argument the kernel reassigns", constant.replace(
            "offs = BLOCK", "BLOCK = BLOCK * 9\n    offs = BLOCK"), []),
        ("a launch in a function, its tensors its parameters", constant.replace(
            "scale_kernel[grid](", "def launch(grid):\n    scale_kernel[grid]("
        ) + "launch((1,))\n", []),
        ("a copy of a view, to fewer elements", constant.replace(
            small, 'torch.randn(4, device="cuda").as_strided((2,), (2,)).contiguous(), n'), []),
        ("a size not spelled out", constant.replace(
            small, 'torch.empty_like(torch.randn(3, device="cuda")), n'), []),
        ("a load read where no value goes",
         constant.replace("    pid = tl.program_id(0)\n", branch), []),
    ):  # fmt: skip
        assert rules.rejects(candidate, OFFSETS_BEST) == expected, why


def test_what_the_h200s_check_logs_showed_triton_refuse_is_rejected_unrun() -> None:
    """Held against the verdicts of two Triton reductions on the H200 (benchmarks/rule_audit.py:
    14 checks that ended in a CompilationError, none that reproduced): a load without its
    pointer or a store without its value (drop_arguments), a number for a mask, `tl.arange` of
    no power-of-two range or of None, and a kernel reading the script's global tensor once its
    own `x = tl.load(...)` is gone."""
    rules = Rules(memory_fault=True, focus=TRITON_FOCUS)
    load, store = "tl.load(c_ptr + offs, mask=mask)", "tl.store(o_ptr + offs, x + c, mask=mask)"
    refused = {
        "tl.load() without its pointer": TRITON_FLAT.replace(load, "tl.load(mask=mask)"),
        "tl.store() without its value": TRITON_FLAT.replace(store, "tl.store(o_ptr + offs, mask=mask)"),
        "tl.load() of a number for its mask": TRITON_FLAT.replace(load, "tl.load(c_ptr + offs, mask=0)"),
        "tl.arange(0, 0): no range of a power of two": TRITON_FLAT.replace("tl.arange(0, BLOCK)", "tl.arange(0, 0)"),
        "tl.arange(0, 6): no range of a power of two": TRITON_FLAT.replace("tl.arange(0, BLOCK)", "tl.arange(0, 6)"),
        "tl.arange() of None": TRITON_FLAT.replace("tl.arange(0, BLOCK)", "tl.arange(0, None)"),
        "kernel add_cond_kernel reads the global tensor x": TRITON_FLAT.replace(
            "    x = tl.load(x_ptr + offs, mask=mask)\n", ""),
    }  # fmt: skip
    for why, candidate in refused.items():
        got = rules.rejects(candidate, TRITON_FLAT)
        assert got and why in got[0], (why, got)
    masked = TRITON_FLAT.replace("mask = offs < n", "mask = 0")
    assert any("of a number for its mask" in v for v in rules.rejects(masked, TRITON_FLAT))
    fine = {
        "a keyword pointer": TRITON_FLAT.replace(load, "tl.load(pointer=c_ptr + offs, mask=mask)"),
        "a range of one": TRITON_FLAT.replace("tl.arange(0, BLOCK)", "tl.arange(0, 1)"),
        "a global read as a constexpr": TRITON_FLAT.replace(
            "    x = tl.load(x_ptr + offs, mask=mask)\n", "    x = tl.load(x_ptr + offs, mask=mask) * SCALE\n"
        ).replace("x = torch.randn(", "SCALE: tl.constexpr = 2\nx = torch.randn("),
    }  # fmt: skip
    for why, candidate in fine.items():
        assert rules.rejects(candidate, TRITON_FLAT) == [], why
