"""The kind rules for Triton kernels: what they reject unrun, what they leave, and (where Triton
is installed) that Triton's own compiler refuses every candidate they reject."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.source.passes.tree import parse
from reprocut.source.triton_kinds import mistyped_kernels
from reprocut.source.validity import Rules

ROOT = Path(__file__).resolve().parent.parent

# cuda_triton_expand_bias's best after its jump to the failing call (the H200's replay)
BEST = """\
import torch
import triton
import triton.language as tl
torch.manual_seed(0)


@triton.jit
def add_cond_kernel(x_ptr, c_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    tl.store(o_ptr + offs, x + c, mask=mask)
x = torch.randn((256, 4096), device='cuda:0')
cond = torch.randn((4096,), device='cuda:0').as_strided((256, 4096), (0, 1))
out = torch.empty_like(x)
n = x.numel()
grid = (triton.cdiv(n, 1024),)
add_cond_kernel[grid](x, cond, out, n, BLOCK=1024)
"""
FOCUS = "add_cond_kernel[grid](x, cond, out, n, BLOCK=1024)"
LOAD_X = "x = tl.load(x_ptr + offs, mask=mask)"

# hoists and integer shrinks of BEST Triton 3.6 refuses, and why the rules say it does
REFUSED = {
    BEST.replace(LOAD_X, "x = x_ptr"): "a pointer and a float in arithmetic",
    BEST.replace(LOAD_X, "x = tl.load(x_ptr, mask=mask)"): (
        "tl.load() of a scalar pointer masked by a block"
    ),
    BEST.replace(LOAD_X, "x = x_ptr + offs"): "a pointer and a float in arithmetic",
    BEST.replace("mask = offs < n", "mask = offs"): "tl.load() masked by an int",
    BEST.replace(
        "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "offs = tl.program_id(0)"
    ).replace("mask = offs < n", "mask = tl.arange(0, BLOCK) < n"): (
        "tl.load() of a scalar pointer masked by a block"
    ),
    BEST.replace("offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "offs = tl.program_id(0)")
    .replace("    mask = offs < n\n", "")
    .replace(", mask=mask", "")
    .replace("x + c", "x + c + tl.arange(0, BLOCK)"): "tl.store() of a block to a scalar pointer",
    BEST.replace("BLOCK=1024)", "BLOCK=640)").replace("1024", "640"): (
        "tl.arange(0, 640): no range of a power of two"
    ),
    BEST.replace("tl.arange(0, BLOCK)", "tl.arange(BLOCK, BLOCK)"): (
        "tl.arange(1024, 1024): no range of a power of two"
    ),
    BEST.replace("x + c", "x_ptr * c"): "a pointer and a float in arithmetic",
    BEST.replace("x + c", "x + c + (x_ptr * 2)"): "a pointer in `*`",
}
CALLS_TORCH = BEST.replace("x + c, mask", "torch.randn((256, 4096), device='cuda:0') + c, mask")
REFUSED[CALLS_TORCH] = "torch.randn() called"
# candidates of BEST Triton 3.6 compiles: the rules must leave them
COMPILED = [
    BEST.replace(LOAD_X, "x = tl.load(x_ptr + offs)"),
    BEST.replace("mask = offs < n", "mask = None"),
    BEST.replace(
        "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "offs = tl.program_id(0)"
    ),
    BEST.replace("BLOCK=1024)", "BLOCK=512)"),
    BEST.replace("x + c", "c"),
]


def test_a_kernels_values_used_as_their_kinds_forbid_are_rejected_unrun() -> None:
    rules = Rules(memory_fault=True, focus=FOCUS)
    assert mistyped_kernels(parse(BEST)) == []
    for candidate, why in REFUSED.items():
        assert candidate != BEST
        broken = rules.rejects(candidate, BEST)
        assert f"CompilationError: {why} in kernel add_cond_kernel" in broken, (why, broken)
        assert all(b.startswith("CompilationError: ") for b in broken), broken


def test_what_the_kinds_allow_or_do_not_decide_is_left_to_the_run() -> None:
    rules = Rules(memory_fault=True, focus=FOCUS)
    for candidate in COMPILED:
        assert rules.rejects(candidate, BEST) == [], candidate
    hoisted = BEST.replace(LOAD_X, "x = x_ptr")
    undecided = {
        # launched from a function: its `x` is a parameter, not the module's tensor
        "in a function": hoisted.replace(
            FOCUS, f"def run(x, cond, out, n):\n    {FOCUS}\nrun(x, cond, out, n)"
        ),
        # launched twice: the kinds may differ between launches
        "launched twice": hoisted + FOCUS + "\n",
        # `x` rebound: which of its values is added is not read
        "rebound": hoisted.replace("    c = tl.load", "    x = x + 1\n    c = tl.load"),
        # what the tensor holds is not known: an integer tensor's load may be added to a pointer
        "unknown dtype": hoisted.replace(
            "cond = torch.randn((4096,), device='cuda:0')", "cond = make_cond()"
        ),
    }
    for why, candidate in undecided.items():
        assert mistyped_kernels(parse(candidate)) == [], why


def test_a_kernel_calling_torch_is_rejected_unrun() -> None:
    """What replace_with_specs made of cuda_triton_expand_bias on the H200 (twice: Triton's
    "Unsupported function referenced: randn")."""
    rules = Rules(memory_fault=True, focus=FOCUS)
    assert rules.rejects(CALLS_TORCH, BEST) == [
        "CompilationError: torch.randn() called in kernel add_cond_kernel"
    ]
    shadowed = CALLS_TORCH.replace("    offs = tl", "    torch = tl\n    offs = tl")
    assert "torch.randn() called" not in str(rules.rejects(shadowed, BEST))


def test_a_name_bound_to_none_and_read_only_as_a_keyword_is_left() -> None:
    """`mask = None` for `tl.load(p, mask=mask)`: Triton compiles it (the rule `None assigned`
    rejected it before; the replayed bests of the H200's Triton reductions offered 33)."""
    rules = Rules(memory_fault=True, focus=FOCUS)
    assert rules.rejects(BEST.replace("mask = offs < n", "mask = None"), BEST) == []
    assert rules.rejects(BEST.replace(LOAD_X, "x = None"), BEST) == [
        "CompilationError: None assigned in kernel add_cond_kernel"
    ]


_COMPILE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from benchmarks.bench_triton_rules import Compiler
texts = json.loads(sys.stdin.read())
compiler = Compiler(Path(sys.argv[2]))
print(json.dumps([compiler.refusal(t) for t in texts]))
"""


def test_triton_refuses_every_candidate_the_kind_rules_reject(tmp_path: Path) -> None:
    """The ground truth of the rules: Triton's compiler (no GPU needed: it compiles for sm_90),
    each candidate run up to its launch with a stand-in torch (bench_triton_rules.Compiler)."""
    pytest.importorskip("triton")
    texts = [BEST, *REFUSED, *COMPILED]
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(ROOT), str(tmp_path)],
                          input=json.dumps(texts), capture_output=True, text=True,
                          timeout=600, check=True)  # fmt: skip
    answers = json.loads(done.stdout.splitlines()[-1])
    assert answers[0] is None  # the best compiles
    refused = answers[1 : 1 + len(REFUSED)]
    assert all(a is not None and not a.startswith("not launched") for a in refused), refused
    assert answers[1 + len(REFUSED) :] == [None] * len(COMPILED)


def test_on_a_sample_of_the_replayed_reductions_triton_agrees_with_every_compile_rule() -> None:
    """bench_triton_rules.py on three bests of each of the H200's two Triton script reductions
    (first, middle, last): no candidate the reducer would run fails to compile, and none the
    compile rules reject compiles."""
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_triton_rules.py"),
                           "--json", "--bests", "3"], capture_output=True, text=True,
                          timeout=900, check=True)  # fmt: skip
    cases = json.loads(done.stdout.splitlines()[-1])
    assert set(cases) == {"cuda_triton_expand_bias", "cuda_triton_int32_offsets"}
    for name, row in cases.items():
        assert row["admitted"] > 20 and row["rules_reject"] > 20, (name, row)
        assert row["cannot_compile"] == 0, (name, row["refusals"])
        assert row["but_compile"] == [], (name, row["but_compile"])
