"""Custom operators: the repro carries the code that registers the op it calls."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from reprocut.check.verify import signature_from_stderr
from reprocut.model.case import ReproCase, TensorSpec
from reprocut.model.errors import ExitCode
from reprocut.shrink.emitter import emit
from reprocut.source.custom_ops import (
    custom_op_name,
    definitions_for,
    registering_names,
    registers,
    slice_definitions,
)

SCRIPTS = Path(__file__).resolve().parent / "scripts" / "custom_op"


def test_only_ops_outside_aten_are_custom() -> None:
    assert custom_op_name("torch.ops.demo.gather_rows.default") == "demo::gather_rows"
    assert custom_op_name("torch.ops.aten.embedding.default") is None
    assert custom_op_name("torch.nn.functional.embedding") is None


def test_registration_is_found_in_python_and_cpp_sources() -> None:
    assert registers('@torch.library.custom_op("demo::f", mutates_args=())', "demo::f")
    cpp = 'TORCH_LIBRARY(rowops, m) {\n  m.def("pad_rows(Tensor x) -> Tensor");\n}'
    assert registers(cpp, "rowops::pad_rows")
    assert not registers(cpp, "rowops::other")
    assert not registers('"demo::fx"', "demo::f")


def test_the_slice_keeps_the_op_and_what_it_needs_and_drops_the_rest() -> None:
    code = (SCRIPTS / "ops.py").read_text()
    kept = slice_definitions(code, "demo::gather_rows")
    assert "custom_op" in kept and "register_fake" in kept and "import torch" in kept
    assert "UNUSED_SCALE" not in kept and "def describe" not in kept
    train = (SCRIPTS / "train.py").read_text()
    assert slice_definitions(train, "demo::gather_rows") == ""  # it only imports the op
    names = registering_names("demo::gather_rows", [SCRIPTS / "train.py", SCRIPTS / "ops.py"])
    assert names == ("gather_rows",)


def test_an_emitted_call_of_a_custom_op_defines_it_and_runs_from_an_empty_folder(
    tmp_path: Path,
) -> None:
    files = [SCRIPTS / "train.py", SCRIPTS / "ops.py"]
    definitions = definitions_for("torch.ops.demo.gather_rows.default", files)
    case = ReproCase(
        target="torch.ops.demo.gather_rows.default",
        args=(TensorSpec((16, 4)), TensorSpec((1,), dtype="int64", values=_ids(18))),
        definitions=definitions,
    )
    code = emit(case).code
    assert code.count("import torch\n") == 1
    assert ReproCase.loads(case.dumps()).definitions == definitions
    (tmp_path / "repro.py").write_text(code)
    done = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert "IndexError: row id 18 is past the table's 16 rows" in done.stderr, done.stderr


def _ids(value: int):  # a Literal of one id
    from reprocut.model.case import Literal

    return Literal((value,))


def test_record_then_shrink_of_a_custom_op_verifies_from_an_empty_folder(tmp_path: Path) -> None:
    """The op is defined in a sibling module; its implementation raises at step 5."""
    work = tmp_path / "project"
    shutil.copytree(SCRIPTS, work, ignore=shutil.ignore_patterns("__pycache__"))
    record = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--json", "train.py"],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    recorded = json.loads(record.stdout)
    assert recorded["status"] == "localized", record.stderr[-2000:]
    shrink = subprocess.run(
        [sys.executable, "-m", "reprocut", "shrink", "--json", "--max-time", "60"],
        cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert shrink.returncode == ExitCode.OK, shrink.stderr[-2000:]
    result = json.loads(shrink.stdout)
    assert result["status"] == "verified"
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(result["repro"], empty / "repro.py")
    shutil.rmtree(work)  # nothing of the project is left to import
    done = subprocess.run([sys.executable, "repro.py"], cwd=empty, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    found = signature_from_stderr(done.stderr)
    assert found is not None, done.stderr
    assert found.error_type == "IndexError"
    assert found.kind == "row id <n> is past the table's <n> rows"
    assert "torch.ops.demo.gather_rows" in (empty / "repro.py").read_text()


CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def test_the_extension_and_triton_op_definitions_keep_what_builds_and_registers_them() -> None:
    """The corpus's TORCH_LIBRARY extension (load_inline) and triton_op cases."""
    ext = CORPUS / "cuda_extension_pad_rows"
    built = definitions_for(
        "torch.ops.rowpad.pack_rows.default", [ext / "train.py", ext / "ext.py"]
    )
    assert "TORCH_LIBRARY(rowpad" in built and "pack_rows_kernel" in built
    assert (
        "load_inline(name=" in built
        and "from torch.utils.cpp_extension import load_inline" in built
    )
    compiled = CORPUS / "cuda_triton_op_compiled"
    files = [compiled / "train.py", compiled / "kernels.py"]
    gated = definitions_for("torch.ops.fused.gated.default", files)
    for needed in ("@triton.jit", "def gated_kernel", '@torch.library.triton_op("fused::gated"',
                   "gated.register_autograd", "def _backward", "def _setup", "import triton.language as tl"):  # fmt: skip
        assert needed in gated, needed
    assert "__future__" not in gated
    assert registering_names("fused::gated", files) == ("gated",)


READS_ITS_SOURCE = """\
import inspect

import torch


def jit(fn):  # as @triton.jit does: it reads the function's source from its file
    fn.source = inspect.getsource(fn)
    return fn


@jit
def kernel(rows):
    return rows


@torch.library.custom_op("demo::sourced", mutates_args=())
def sourced(x: torch.Tensor) -> torch.Tensor:
    raise IndexError(f"row {x.shape[0]} past the table ({len(kernel.source)} chars of kernel)")
"""


def test_an_oracle_check_of_a_custom_op_call_can_read_the_ops_source() -> None:
    """`@triton.jit` reads its function's source from the file: the check writes it."""
    from reprocut.check.oracle import Oracle, Reproduced
    from reprocut.model.case import Signature

    expected = Signature(
        "IndexError", None, "demo::sourced", "row <n> past the table (<n> chars of kernel)"
    )
    case = ReproCase(target="torch.ops.demo.sourced.default", args=(TensorSpec((3, 2)),),
                     expected=expected, definitions=READS_ITS_SOURCE)  # fmt: skip
    with Oracle(timeout=60) as oracle:
        verdict = oracle.check_case(case)
    assert isinstance(verdict, Reproduced), verdict


def test_the_ways_are_tried_in_order_and_each_decline_is_said() -> None:
    """make_repro: the first way that makes an Outcome wins; the ways before it that declined
    are returned in order and said on the console; ways that do not apply are skipped."""
    import io

    from rich.console import Console

    from reprocut.pipeline.cases import Outcome
    from reprocut.pipeline.declined import Declined
    from reprocut.pipeline.ways import Shrinking, Unmade, make_repro

    def outcome(code: str, reproduced: bool) -> Outcome:
        return Outcome(code, 1, None, 0, False, reproduced_from_capture=reproduced)

    class Way:
        def __init__(self, name: str, applies: bool, made: Outcome | None) -> None:
            self.name, self._applies, self.made, self.before = name, applies, made, None

        def applies(self, shrinking: Shrinking) -> bool:
            return self._applies

        def attempt(self, shrinking: Shrinking, before: tuple[Declined, ...]) -> Outcome | Unmade:
            self.before = before
            if self.made is not None:
                return self.made
            return Unmade(Declined(self.name, f"{self.name} did not"), outcome(self.name, False))

    stream = io.StringIO()
    shrinking = Shrinking(  # only the console is read by make_repro itself
        None, None, {}, None, None, None, None, print, Console(file=stream, width=200),  # type: ignore[arg-type]
        out=Path("."), source=False,
    )  # fmt: skip
    first, skipped, last = Way("first", True, None), Way("skipped", False, None), Way("last", True, outcome("made", True))  # fmt: skip
    made, declined = make_repro(shrinking, [first, skipped, last])
    assert made.code == "made" and declined == (Declined("first", "first did not"),)
    assert last.before == declined and skipped.before is None
    assert "note: first did not" in stream.getvalue()
    unmade, declined = make_repro(shrinking, [Way("a", True, None), Way("b", True, None)])
    assert unmade.code == "b" and [d.way for d in declined] == ["a", "b"]
