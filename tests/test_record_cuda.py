"""`reprocut record` on real CUDA errors (run on a GPU; skipped elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.model.errors import ExitCode

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.cuda


def culprit_line(path: Path) -> int:
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if "# reprocut: culprit" in text:
            return number
    raise AssertionError(f"no culprit marker in {path}")


def record(tmp_path: Path, script: Path, *flags: str) -> tuple[int, dict]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocut",
            "record",
            "--json",
            "--quiet",
            "--timeout",
            "240",
            "--root",
            str(tmp_path / "rec"),
            *flags,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    report["_stderr"] = done.stderr
    return done.returncode, report


def test_embedding_id_out_of_range_surfacing_later(tmp_path):
    script = SCRIPTS / "cuda_embedding_late.py"
    code, report = record(tmp_path, script)
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["op"] == "aten::embedding"
    assert report["step"] == 7
    assert report["source"]["line"] == culprit_line(script)
    assert report["error"]["code"] == 710
    assert report["signature"]["kind"] == "index out of bounds"
    assert any("index max 1000 ≥ 1000 rows at [2, 3]" in f for f in report["facts"]), report[
        "facts"
    ]
    assert report["surfaced_at"] is not None
    assert report["surfaced_at"]["line"] != report["source"]["line"], (
        "the async error surfaced later"
    )


def test_cross_entropy_target_surfacing_in_backward(tmp_path):
    script = SCRIPTS / "cuda_ce_backward.py"
    code, report = record(tmp_path, script)
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["op"] == "aten::nll_loss_forward"
    assert report["public_call"] == "torch.nn.functional.cross_entropy"
    assert report["step"] == 4
    assert report["source"]["line"] == culprit_line(script)
    assert report["signature"]["kind"] == "target out of bounds"
    assert any("target max 10 ≥ 10 classes at [5]" in f for f in report["facts"]), report["facts"]


def test_nan_into_multinomial(tmp_path):
    script = SCRIPTS / "cuda_multinomial_nan.py"
    code, report = record(tmp_path, script)
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["op"] == "aten::multinomial"
    assert report["step"] == 3
    assert report["source"]["line"] == culprit_line(script)
    assert report["signature"]["kind"] == "invalid probability distribution"
    assert any("NaN" in f for f in report["facts"]), report["facts"]


def test_triton_kernel_fault_is_localized_to_its_launch_line(tmp_path):
    pytest.importorskip("triton")
    script = SCRIPTS / "cuda_triton_stride.py"
    code, report = record(tmp_path, script)
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["status"] == "outside-dispatcher"
    assert report["step"] == 2
    assert report["source"]["line"] == culprit_line(script)
    assert report["signature"]["error_code"] == 700


def test_rerun_path_without_snapshots_finds_the_same_culprit(tmp_path):
    script = SCRIPTS / "cuda_embedding_late.py"
    code, report = record(tmp_path, script, "--no-snapshots")
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["localization"] == "rerun"
    assert report["op"] == "aten::embedding"
    assert report["source"]["line"] == culprit_line(script)
    assert any("index max 1000" in f for f in report["facts"]), report["facts"]


def test_a_fault_launched_by_the_scripts_last_statement_is_caught(tmp_path):
    pytest.importorskip("triton")
    script = SCRIPTS / "cuda_fault_at_exit.py"
    code, report = record(tmp_path, script)
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["status"] == "outside-dispatcher"
    assert report["source"]["line"] == culprit_line(script)
    assert report["signature"]["error_code"] == 700
    # On the H200 it surfaced in the launch line itself, even behind queued matrix products;
    # where it does not, the wait at the script's end catches it.
    surfaced = report["surfaced_at"]
    assert surfaced["line"] == culprit_line(script) or "end of script" in surfaced["text"]


def test_a_cupy_kernel_fault_is_localized_to_its_launch_line(tmp_path):
    pytest.importorskip("cupy")
    case = Path(__file__).parent.parent / "corpus" / "cuda_cupy_misaligned_vec4"
    code, report = record(tmp_path, case / "train.py")
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["status"] == "outside-dispatcher"
    assert report["step"] == 4
    # CuPy's launch does not raise even with blocking launches: the wait after each line does
    assert Path(report["source"]["file"]).name == "kernels.py"
    assert report["source"]["line"] == culprit_line(case / "kernels.py")
    assert report["signature"]["error_code"] == 716
