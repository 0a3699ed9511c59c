"""The whole pipeline's timing and concurrency: parallel plain verification that still counts a
flaky repro, per-phase seconds in --json and meta.json, and `record --shrink` in one command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from reprocut.check.verify import signature_from_stderr, verify
from reprocut.cli import main
from reprocut.model.case import Captured, Generated, ReproCase, Signature, TensorSpec
from reprocut.model.errors import ExitCode
from reprocut.model.recording import ErrorInfo, Failure, RunDir
from reprocut.report.display.shrink import print_result

ROOT = Path(__file__).resolve().parent.parent
EMBEDDING = Signature("IndexError", None, "aten::embedding", "index out of range in self")
PHASES = {"fork_server", "read", "first_check", "shrink", "cpu_check", "verify", "report"}

# Fails on every other run, counted in a file under an exclusive lock: runs side by side each
# get their own number, so the count of failures is exact however the runs interleave.
COUNTED = """\
import fcntl, pathlib, time
counter = pathlib.Path(__file__).with_name("count")
with open(counter, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = int(f.read() or 0)
    f.seek(0)
    f.truncate()
    f.write(str(n + 1))
time.sleep(1.0)
if n % 2 == 0:
    raise IndexError("index out of range in self")
"""


def test_parallel_verification_counts_a_flaky_repro(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(COUNTED)
    started = time.perf_counter()
    verification = verify(script, EMBEDDING, runs=4, timeout=60)
    wall = time.perf_counter() - started
    assert (verification.runs, verification.reproduced) == (4, 2)
    assert verification.exit_code == ExitCode.FLAKY
    assert (tmp_path / "count").read_text() == "4"  # four fresh processes ran
    # side by side: the wall time is about one run's (each sleeps 1 s), not four
    assert wall < 0.6 * sum(outcome.seconds for outcome in verification.outcomes), wall
    serial = verify(script, EMBEDDING, runs=2, timeout=60, parallel=False)
    assert serial.reproduced == 1  # runs 4 and 5: one even, one odd


def test_the_phases_line_names_each_phase() -> None:
    console = Console(record=True, width=200, force_terminal=False)
    result = {"repro": "repro.py", "statements": 3, "checks": 4, "seconds": 5.0}
    print_result(console, {**result, "phases": {"fork_server": 1.25, "verify": 2.5}})
    assert "time: fork server start 1.2 s · verification 2.5 s" in console.export_text()


def _embedding_recording(root: Path) -> RunDir:
    ids = torch.randint(0, 50, (4, 16))
    ids[2, 5] = 1000
    case = ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((4, 16), dtype="int64", values=Captured("ids")),
            TensorSpec((50, 32), values=Generated("randn")),
        ),
        expected=EMBEDDING,
        aten_op="aten::embedding",
        inputs_file="inputs.pt",
    )
    run = RunDir.create(root / ".reprocut", "case")
    torch.save({"ids": ids}, run.inputs_path)
    run.write_meta({"status": "localized", "seconds": 1.0})
    run.write_failure(
        Failure(
            status="localized",
            error=ErrorInfo("IndexError", "index out of range in self"),
            signature=EMBEDDING,
            op="aten::embedding",
            public_call=case.target,
            cases=(case,),
            device="cpu",
        )
    )
    return run


def test_phases_are_in_the_json_and_in_meta_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _embedding_recording(tmp_path)
    code = main(["shrink", str(run.path), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK and result["status"] == "verified", result
    phases = result["phases"]
    assert set(phases) == PHASES, phases
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["verify"] > 0.1  # three plain runs, each importing torch
    meta = json.loads(run.meta_path.read_text())
    assert meta["seconds"] == 1.0  # record's figures stay
    assert meta["shrink"]["phases"] == phases
    assert meta["shrink"]["status"] == "verified"


def test_the_verification_runs_in_interpreters_started_with_the_shrink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a machine with the cores for it: the emitted repro starts with `import torch`, so
    its plain runs go to the interpreters started with the shrink, and each runs it to its
    failure (exit status 1: not killed unused). No best stands long enough here to be
    verified before the reduction ends (tests/test_verify_ahead.py has that)."""
    from reprocut.check import plainrun
    from reprocut.pipeline import verify_ahead
    from reprocut.pipeline.ahead import Ahead

    monkeypatch.setattr(plainrun, "WARM_CORES", 1)
    monkeypatch.setattr(verify_ahead, "SETTLE", 3600.0)
    handed: list[list[subprocess.Popen[str]]] = []
    standbys_for = Ahead.standbys_for

    def noted(ahead: Ahead, repro: Path) -> object:
        found = standbys_for(ahead, repro)
        handed.append([standby.process for standby in found])  # type: ignore[attr-defined]
        return found

    monkeypatch.setattr(Ahead, "standbys_for", noted)
    run = _embedding_recording(tmp_path)
    code = main(["shrink", str(run.path), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK and result["verified"] == {"runs": 3, "reproduced": 3}, result
    (processes,) = handed
    assert len(processes) == 3
    assert [process.returncode for process in processes] == [1, 1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_record_shrink_writes_a_verified_repro_in_one_command(tmp_path: Path, device: str) -> None:
    work = tmp_path / "project"
    shutil.copytree(ROOT / "examples", work / "examples")
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--shrink", "--json", "--quiet",
         "examples/train_embedding.py", "--device", device],
        cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == ExitCode.OK, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "localized" and report["op"] == "aten::embedding"
    shrunk = report["shrink"]
    assert shrunk["status"] == "verified", shrunk
    assert shrunk["verified"] == {"runs": 3, "reproduced": 3}
    assert set(shrunk["phases"]) == PHASES
    assert shrunk["phases"]["fork_server"] < 1.0  # record had started it
    repro = Path(shrunk["repro"])
    assert repro.parent == Path(report["run_dir"]).resolve()
    meta = json.loads((repro.parent / "meta.json").read_text())
    assert meta["status"] == "localized" and meta["shrink"]["phases"] == shrunk["phases"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(repro, elsewhere / "repro.py")
    plain = subprocess.run(
        [sys.executable, "repro.py"], cwd=elsewhere, capture_output=True, text=True, timeout=300
    )
    expected = Signature(**shrunk["signature"])
    if device == "cpu":
        assert expected.matches(EMBEDDING)
    else:  # a device-side assert, localized by replay or rerun with the warm oracle
        assert (expected.error_code, expected.kind) == (710, "index out of bounds"), expected
    found = signature_from_stderr(plain.stderr)
    assert found is not None and found.matches(expected, compare_op=False), plain.stderr
