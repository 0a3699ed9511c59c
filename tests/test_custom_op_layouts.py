"""Custom ops at the op level, for every layout users write them in.

The definition in the script or in a sibling module (or two imports away); under import guards
(`try: import numpy / except ImportError`, `else:`, `if np is not None:`) and behind exits for
machines that cannot run it; `custom_op` with `mutates_args`, `register_fake`,
`register_autograd`; a `torch.library.Library`'s `define`/`impl`; `load_inline` with a
TORCH_LIBRARY block or with `functions=` wrapped by a custom op; the op called from a
torch.compile'd model; a `triton_op` with `wrap_triton` (its slice, on the source text: no Triton
here). The fast tests slice the layout scripts (tests/scripts/custom_op_layouts/) and small
sources; the slow ones record and shrink each script, then run the repro with a plain
`python repro.py` in an empty folder, with the project deleted.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reprocut.check.verdicts import Crashed, ForkOnly, OtherFailure, Passed, TimedOut
from reprocut.check.verify import signature_from_stderr
from reprocut.model.case import ReproCase, Signature
from reprocut.model.errors import ExitCode
from reprocut.pipeline.declined import captured_call_declined, what_it_did
from reprocut.source.custom_ops import (
    definitions_for,
    registering_names,
    slice_definitions,
    user_files,
)
from reprocut.source.custom_ops.guards import Facts, evaluate

LAYOUTS = Path(__file__).resolve().parent / "scripts" / "custom_op_layouts"
CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def layout_definitions(folder: str, target: str) -> str:
    return definitions_for(target, user_files(LAYOUTS / folder / "train.py"), device="cpu")


def code_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


# --- the layout scripts, sliced -------------------------------------------------------------


SLICES = {  # folder: (op, what the slice keeps, what it leaves out, its lines of code)
    "in_script_mutates": (
        "torch.ops.calib.bucket_add_.default",
        ['@torch.library.custom_op("calib::bucket_add_", mutates_args=("counts",))',
         "@bucket_add_.register_fake"],
        ["BUCKETS", "argparse", "def batches", "def main", "nn.Sequential"],
        12,
    ),
    "numpy_guard": (
        "torch.ops.grid.cell_features.default",
        ["import numpy as np", "cell_features.register_autograd(_backward, setup_context=_setup)",
         "@cell_features.register_fake"],
        ["np = None", "if np is not None", "ImportError", "return table[cells]", "def cells_of",
         "GRID"],
        18,
    ),
    "extension_exit_guard": (
        "torch.ops.seglib.segment_sum.default",
        ["TORCH_LIBRARY(seglib, m)", "load_inline(", 'torch.library.register_autograd(\n    "seglib::segment_sum"'],
        ["sys.exit", "SystemExit", "shutil", "DEVICE", "class GraphClassifier", "argparse"],
        44,
    ),
    "functions_wrapper": (
        "torch.ops.ragged.mean.default",
        ['_C = load_inline(name="ragged_layout_cpu", cpp_sources=RAGGED_CPP, functions=["ragged_mean"])',
         "return _C.ragged_mean(values, offsets)", "@ragged_mean.register_fake"],
        ["from ext import", "def describe"],
        30,
    ),
    "library_define": (
        "torch.ops.tok.pack.default",
        ['lib = torch.library.Library("tok", "DEF")', 'lib.impl("pack", _pack, "CPU")',
         '@torch.library.register_fake("tok::pack")', "PAD = 0"],
        ["fast_tokens", "HAVE_FAST_TOKENS", "pack_cpu"],
        17,
    ),
    "compiled_model": (
        "torch.ops.relpos.bias.default",
        ["@relative_bias.register_fake", "relative_bias.register_autograd"],
        ["class Block", "torch.compile", "BUCKETS"],
        19,
    ),
}  # fmt: skip


@pytest.mark.parametrize("folder", sorted(SLICES))
def test_each_layout_slices_to_the_registration_and_what_it_needs(folder: str) -> None:
    target, kept, dropped, lines = SLICES[folder]
    code = layout_definitions(folder, target)
    compile(code, "definitions", "exec")
    for text in kept:
        assert text in code, f"{folder}: lost {text!r}\n{code}"
    for text in dropped:
        assert text not in code, f"{folder}: kept {text!r}\n{code}"
    assert code_lines(code) == lines, code


def test_a_guarded_triton_op_keeps_the_import_that_ran_and_its_kernel() -> None:
    """corpus/cuda_triton_op_guarded as on a machine with Triton: the import guard collapses
    to `import triton`, `if triton is not None:` to its body, the fallback goes."""
    case = CORPUS / "cuda_triton_op_guarded"
    files = user_files(case / "train.py")
    code = definitions_for("torch.ops.qknorm.rms_scale.default", files, device="cuda",
                           importable=lambda name: True)  # fmt: skip
    assert code.startswith("import triton\nimport triton.language as tl\nimport torch\n"), code
    for text in ("@triton.jit\ndef rms_scale_kernel(", '@torch.library.triton_op("qknorm::rms_scale"',
                 "torch.library.wrap_triton(rms_scale_kernel)[(rows,)]", "EPS = 1e-6",
                 "rms_scale.register_autograd(_backward, setup_context=_setup)"):  # fmt: skip
        assert text in code, text
    for text in ("triton = None", "if triton is not None", "ImportError", "class Attention",
                 "return x * torch.rsqrt"):  # fmt: skip
        assert text not in code, text
    assert code_lines(code) == 35
    assert registering_names("qknorm::rms_scale", files) == ("rms_scale",)


def test_an_extension_behind_an_exit_guard_keeps_its_build_and_drops_the_guard() -> None:
    case = CORPUS / "cuda_extension_exit_guard"
    code = definitions_for("torch.ops.clippool.segment_sum.default", user_files(case / "train.py"),
                           device="cuda")  # fmt: skip
    assert "TORCH_LIBRARY(clippool, m)" in code and "__global__ void segment_sum_kernel" in code
    assert 'load_inline(\n    name="clippool_ext",' in code
    assert 'torch.library.register_autograd(\n    "clippool::segment_sum"' in code
    for text in ("sys.exit", "DEVICE", "FRAME_FEATURES", "class ClipClassifier", "empty_cache"):
        assert text not in code, text


# --- guards, on small sources ---------------------------------------------------------------


TRY_IMPORT = """\
import torch
try:
    import fancy_kernels
except ImportError:
    fancy_kernels = None
    HAVE_FANCY = False
else:
    HAVE_FANCY = True

if HAVE_FANCY:
    KERNEL = fancy_kernels.kernel
else:
    KERNEL = torch.neg

@torch.library.custom_op("demo::f", mutates_args=())
def f(x: torch.Tensor) -> torch.Tensor:
    return KERNEL(x)
"""


@pytest.mark.parametrize(
    ("importable", "expected"),
    [
        (True, "import fancy_kernels\n\nKERNEL = fancy_kernels.kernel\n"),
        (False, "KERNEL = torch.neg\n"),
    ],
)
def test_an_import_guard_and_a_test_on_what_it_bound_resolve_to_the_branch_that_ran(
    importable: bool, expected: str
) -> None:
    code = slice_definitions(TRY_IMPORT, "demo::f", importable=lambda name: importable)
    assert code.startswith("import torch\n") and expected in code, code
    assert "HAVE_FANCY" not in code and "try:" not in code and "fancy_kernels = None" not in code


EXIT_GUARDS = """\
import os
import sys
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE != "cuda":
    sys.exit("needs a GPU")
if not torch.cuda.is_available():
    raise SystemExit(1)
if os.environ.get("SKIP"):
    print("skipping")
    os._exit(0)
else:
    SCALE = 2.0

@torch.library.custom_op("demo::f", mutates_args=())
def f(x: torch.Tensor) -> torch.Tensor:
    return x * SCALE
"""


@pytest.mark.parametrize(  # ids without "cuda": conftest skips a test whose keywords hold it
    "device", [pytest.param(None, id="unknown"), pytest.param("cuda", id="gpu")]
)
def test_exit_guards_are_dropped_and_the_branch_past_them_kept(device: str | None) -> None:
    code = slice_definitions(EXIT_GUARDS, "demo::f", device=device)
    assert code.splitlines()[:3] == ["import torch", "", "SCALE = 2.0"], code
    for text in ("sys", "SystemExit", "DEVICE", "os", "skipping"):
        assert text not in code


def test_an_unresolved_guard_stays_whole_when_it_binds_a_needed_name() -> None:
    source = (
        "import sys\nimport torch\nif sys.version_info >= (3, 12):\n    SIZE = 2\nelse:\n"
        "    SIZE = 1\nOTHER = 3\n"
        '@torch.library.custom_op("demo::f", mutates_args=())\n'
        "def f(x: torch.Tensor) -> torch.Tensor:\n    return x * SIZE\n"
    )
    code = slice_definitions(source, "demo::f")
    assert "if sys.version_info >= (3, 12):\n    SIZE = 2\nelse:\n    SIZE = 1" in code
    assert "import sys" in code and "OTHER" not in code


def test_evaluate_works_out_guard_tests_from_what_is_known() -> None:
    import libcst as cst

    facts = Facts(values={"np": None, "DEVICE": "cuda", "HAS": True}, cuda=True)
    cases = {
        "np is not None": False, "np is None": True, "not HAS": False, "DEVICE == 'cuda'": True,
        "DEVICE != 'cuda' or HAS": True, "torch.cuda.is_available()": True,
        "TYPE_CHECKING": False, "HAS and np": None, "unknown_name": "unknown",
    }  # fmt: skip
    for text, expected in cases.items():
        value = evaluate(cst.parse_expression(text), facts)
        if expected == "unknown":
            assert type(value).__name__ == "_Unknown", text
        else:
            assert value == expected, text


def test_locals_and_parameters_do_not_pull_in_module_level_names() -> None:
    """`x` in the op is its parameter, not the training loop's `x`."""
    source = (
        "import torch\nx = torch.randn(3)\nloss = x.sum()\n"
        '@torch.library.custom_op("demo::f", mutates_args=())\n'
        "def f(x: torch.Tensor) -> torch.Tensor:\n    loss = x * 2\n    return loss\n"
        "for step in range(3):\n    x = f(x)\n"
    )
    code = slice_definitions(source, "demo::f")
    assert "randn" not in code and "loss = x.sum()" not in code and "for step" not in code


def test_a_builder_called_only_from_main_is_called_after_its_definition() -> None:
    source = """\
import os
import torch
from torch.utils.cpp_extension import load_inline

SRC = "TORCH_LIBRARY(seg, m) { m.def(\\"total(Tensor x) -> Tensor\\"); }"
os.environ["MAX_JOBS"] = "2"

def build():
    return load_inline(name="seg", cpp_sources=SRC, is_python_module=False)

def main():
    build()
    for step in range(10):
        torch.ops.seg.total(torch.ones(2))

if __name__ == "__main__":
    main()
"""
    code = slice_definitions(source, "seg::total")
    assert code.endswith("def build():\n    return load_inline("
                         'name="seg", cpp_sources=SRC, is_python_module=False)\n\n\nbuild()\n'), code  # fmt: skip
    assert 'os.environ["MAX_JOBS"] = "2"' in code and "def main" not in code


def test_a_sibling_module_is_inlined_for_the_names_imported_from_it(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text(
        "import math\nimport torch\nFACTOR = math.pi\nUNUSED = 1\n"
        "def scale(x):\n    return x * FACTOR\n"
    )
    (tmp_path / "ops.py").write_text(
        "import torch\nfrom helpers import scale as times_pi\n"
        '@torch.library.custom_op("demo::f", mutates_args=())\n'
        "def f(x: torch.Tensor) -> torch.Tensor:\n    return times_pi(x)\n"
    )
    (tmp_path / "train.py").write_text("import ops\nops.f(ops.torch.ones(2))\n")
    files = user_files(tmp_path / "train.py")
    assert [p.name for p in files] == ["train.py", "ops.py", "helpers.py"]
    code = definitions_for("torch.ops.demo.f.default", files)
    assert "from helpers" not in code and "UNUSED" not in code
    assert "FACTOR = math.pi" in code and "times_pi = scale" in code
    namespace: dict[str, object] = {}
    exec(compile(code.replace('"demo::f"', '"demo_inlined::f"'), "defs", "exec"), namespace)
    assert float(namespace["f"](__import__("torch").ones(1))) == pytest.approx(3.14159, 1e-4)  # type: ignore[operator]


def test_an_op_in_a_package_two_imports_away_takes_its_kernel_from_another_module(
    tmp_path: Path,
) -> None:
    """train.py -> models/__init__.py -> models/ops.py, whose kernel is in models/kernels.py,
    imported by its package path as `python train.py` finds it."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "__init__.py").write_text("from models.ops import double\n")
    (models / "kernels.py").write_text("def twice(x):\n    return x * 2\n")
    (models / "ops.py").write_text(
        "import torch\nfrom models.kernels import twice\n"
        '@torch.library.custom_op("pkg::double", mutates_args=())\n'
        "def double(x: torch.Tensor) -> torch.Tensor:\n    return twice(x)\n"
    )
    (tmp_path / "train.py").write_text("import models\n")
    files = user_files(tmp_path / "train.py")
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "train.py", "models/__init__.py", "models/ops.py", "models/kernels.py"
    ]  # fmt: skip
    code = definitions_for("torch.ops.pkg.double.default", files)
    assert code.startswith("import torch\n\n\ndef twice(x):\n    return x * 2\n"), code
    assert "from models" not in code


# --- what the captured call did instead -----------------------------------------------------


def test_a_declined_captured_call_says_what_it_did() -> None:
    raised = Signature("NameError", None, None, "name <s> is not defined")
    assert what_it_did(OtherFailure(raised, "name 'triton' is not defined\nmore", "", 1.0)) == (
        "it raised NameError: name 'triton' is not defined"
    )
    assert what_it_did(Passed(0.5)) == "it ran without an error"
    assert what_it_did(TimedOut(60.0)) == "it did not finish in 60 s"
    assert what_it_did(Crashed(-11, "Segmentation fault\n", 1.0)) == (
        "its process died (exit code -11): Segmentation fault"
    )
    fork = ForkOnly(raised, None, "", 1.0)
    assert what_it_did(fork) == (
        "it failed in the fork server's child only; a plain `python repro.py` passed"
    )
    cases = [ReproCase("torch.ops.seglib.segment_sum.default", ()),
             ReproCase("torch.nn.functional.one_hot", ())]  # fmt: skip
    assert captured_call_declined(cases, [Passed(0.1)]) == (
        "the captured call of `seglib::segment_sum` did not reproduce: it ran without an error; "
        "the captured call of `torch.nn.functional.one_hot` did not reproduce: it was not checked"
    )


# --- end to end: record, shrink, `python repro.py` from an empty folder ----------------------


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reprocut", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@dataclass(frozen=True)
class Shrunk:
    recorded: dict[str, Any]  # record's JSON
    result: dict[str, Any]  # shrink's JSON
    repro: Path  # alone in an empty folder
    stderr: str  # shrink's
    report: str  # report.md


def record_and_shrink(folder: str, tmp_path: Path, *, keep_project: bool = False) -> Shrunk:
    """Record the layout's script and shrink it at the defaults, and copy the repro alone into
    an empty folder (the project deleted unless `keep_project`: a reduced script imports the
    user's modules from it)."""
    work = tmp_path / "project"
    shutil.copytree(LAYOUTS / folder, work, ignore=shutil.ignore_patterns("__pycache__"))
    record = _run(["record", "--json", "train.py"], work, 900)
    recorded = json.loads(record.stdout)
    assert recorded["status"] == "localized", record.stderr[-3000:]
    shrink = _run(["shrink", "--json"], work, 900)
    assert shrink.returncode == ExitCode.OK, shrink.stderr[-3000:]
    result = json.loads(shrink.stdout)
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(result["repro"], empty / "repro.py")
    report = Path(result["report"]).read_text()
    if not keep_project:
        shutil.rmtree(work)
    return Shrunk(recorded, result, empty / "repro.py", shrink.stderr, report)


def definition_lines(repro: str) -> int:
    """Lines of code of what repro.py defines before main(): the op's registration and what
    it needs (imports included), not the header docstring, main() or its `__main__` guard."""
    module = ast.parse(repro)
    lines = repro.splitlines()
    count = 0
    for node in module.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the header
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            continue
        if isinstance(node, ast.If):  # if __name__ == "__main__":
            continue
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        count += code_lines("\n".join(lines[start - 1 : node.end_lineno]))
    return count


def run_repro(repro: Path) -> Signature | None:
    done = subprocess.run([sys.executable, repro.name], cwd=repro.parent, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    return signature_from_stderr(done.stderr)


E2E = {  # folder: (error type, kind, statements in main()); its definitions: SLICES' lines
    "in_script_mutates": ("IndexError", "bucket <n> is past the histogram's <n> buckets", 3),
    "numpy_guard": ("IndexError", "index <n> is out of bounds for axis <n> with size <n>", 3),
    "extension_exit_guard": ("RuntimeError", "segment id <n> out of range for <n> segments", 3),
    "functions_wrapper": ("RuntimeError", "offsets <n>..<n> run past the <n> values", 3),
    "library_define": ("ValueError", "a sequence of <n> tokens does not fit in <n> columns", 3),
    "compiled_model": ("IndexError", "distance <n> is past the bias table's <n> buckets", 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(E2E))
def test_each_layout_shrinks_at_the_op_level_and_runs_from_an_empty_folder(
    folder: str, tmp_path: Path
) -> None:
    error_type, kind, statements = E2E[folder]
    lines = SLICES[folder][3]  # `import torch` once: the repro's definitions are the slice
    shrunk = record_and_shrink(folder, tmp_path)
    result, repro = shrunk.result, shrunk.repro
    assert result["status"] == "verified" and result["path"] == "shrink", result
    assert result["declined"] == []
    if folder == "compiled_model":  # it fails compiled and eagerly: the repro calls it eagerly
        compiled = shrunk.recorded["torch_compile"]
        assert compiled["compiled"] == ["Block"] and compiled["fails_eagerly"] is True
        assert compiled["compiled_run"]["error_type"] == "IndexError"
    code = repro.read_text()
    assert (result["statements"], definition_lines(code)) == (statements, lines), code
    found = run_repro(repro)
    assert found is not None and (found.error_type, found.kind) == (error_type, kind), code


@pytest.mark.slow
def test_a_captured_call_that_does_not_reproduce_says_why_before_the_script_is_reduced(
    tmp_path: Path,
) -> None:
    """The op reads module state the script sets from its arguments: called alone it raises a
    TypeError, not the user's ZeroDivisionError; the script, reduced, does."""
    shrunk = record_and_shrink("state_dependent", tmp_path, keep_project=True)
    result = shrunk.result
    reason = (
        "the captured call of `norm::scaled` did not reproduce: it raised TypeError in "
        "norm::scaled: unsupported operand type(s) for *: 'Tensor' and 'NoneType'"
    )
    assert result["declined"] == [{"way": "captured call", "reason": reason}]
    assert result["status"] == "verified" and result["path"] == "source", result
    assert f"note: {reason}" in shrunk.stderr
    assert f"> {reason} (the script was reduced instead)" in shrunk.report
    found = run_repro(shrunk.repro)
    assert found is not None and found.error_type == "ZeroDivisionError"


def test_the_fork_server_imports_what_a_custom_ops_definitions_import(tmp_path: Path) -> None:
    """The definitions' installed packages (rich here, triton on the GPU) and the torch.library
    machinery are imported once by the fork server, not by every check of the captured call;
    the user's own modules never are."""
    from reprocut.check.oracle import Oracle, Passed
    from reprocut.model.recording import ErrorInfo, Failure
    from reprocut.pipeline.run import preload_definitions

    (tmp_path / "helpers.py").write_text("SCALE = 2\n")
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    definitions = (
        "import rich.text\nimport torch\nimport helpers\n\n"
        '@torch.library.custom_op("demo::twice", mutates_args=())\n'
        "def twice(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x * helpers.SCALE if rich.text else x\n"
    )
    signature = Signature("IndexError", "demo::twice", None, "index 9 is out of bounds")
    case = ReproCase("torch.ops.demo.twice.default", (), definitions=definitions)
    failure = Failure("localized", ErrorInfo("IndexError", signature.kind), signature,
                      cases=(case,), script=str(script), cwd=str(tmp_path))  # fmt: skip
    with Oracle(timeout=60) as oracle:
        preload_definitions(oracle, failure)
        wanted = ("rich.text", "helpers", "torch._dynamo")
        probe = f"import sys\nprint(sorted(m for m in {wanted!r} if m in sys.modules))\n"
        verdict = oracle.check_source(probe, filename=str(tmp_path / "c.py"), cwd=tmp_path)
        assert isinstance(verdict, Passed), verdict
        assert verdict.stdout.strip() == "['rich.text', 'torch._dynamo']"
        assert oracle.preloaded is not None and "helpers" not in oracle.preloaded["loaded"]
