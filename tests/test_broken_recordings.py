"""Recordings that cannot be shrunk the usual way: a missing inputs file, a crash with no
traceback. Real `reprocut` processes on real recordings (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.model.errors import ExitCode

REPO = Path(__file__).parent.parent
SCRIPTS = Path(__file__).parent / "scripts"


def reprocut(command: str, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", command, "--json", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def line_of(path: Path, needle: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text)


def test_shrink_without_the_inputs_file_is_a_corrupt_recording(tmp_path):
    code, report, _ = reprocut(
        "record", "--quiet", "--root", str(tmp_path), str(SCRIPTS / "ce_target.py")
    )
    assert code == ExitCode.OK and report["status"] == "localized"
    run_dir = Path(report["run_dir"])
    (run_dir / "inputs.pt").unlink()
    code, report, stderr = reprocut("shrink", str(run_dir))
    assert code == ExitCode.USAGE_ERROR, stderr
    assert report["status"] == "corrupt-recording"
    assert "inputs.pt" in report["message"]
    assert "internal error" not in stderr


@pytest.fixture(scope="module")
def segfault(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict]:
    root = tmp_path_factory.mktemp("segv")
    code, report, _ = reprocut(
        "record", "--quiet", "--root", str(root), str(SCRIPTS / "segfaults.py")
    )
    return code, report


def test_a_segfault_is_recorded_as_a_crash_at_the_faulthandler_line(segfault):
    code, report = segfault
    script = SCRIPTS / "segfaults.py"
    assert code == ExitCode.NOT_LOCALIZED
    assert report["error"]["type"] == "Crash"
    assert "signal 11" in report["error"]["message"] and "SIGSEGV" in report["error"]["message"]
    assert report["source"]["file"] == str(script.resolve())
    assert report["source"]["line"] == line_of(script, "ctypes.string_at(0)")


def test_shrinking_a_deterministic_segfault_verifies_a_crashing_repro(segfault):
    _, recorded = segfault
    code, report, stderr = reprocut("shrink", recorded["run_dir"], "--max-time", "120")
    assert code == ExitCode.OK, stderr
    assert report["status"] == "verified"
    assert report["verified"] == {"runs": 3, "reproduced": 3}
    assert report["signature"]["error_type"] == "Crash"
    assert report["signature"]["kind"] == "signal 11"
    repro = Path(report["repro"]).read_text()
    assert "ctypes.string_at(0)" in repro and "backward" not in repro
    done = subprocess.run([sys.executable, report["repro"]], capture_output=True, timeout=120)
    assert done.returncode == -11
