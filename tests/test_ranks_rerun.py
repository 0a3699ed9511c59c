"""A torchrun rank that died before reporting, localized by running the whole job again (the real
torchrun, 2 ranks over gloo) with that rank synchronized at the steps its trace ends in and the
other ranks run plainly; its recording then shrinks to a single-process repro.py.

On the H200 such a rank died by SIGSEGV after its device assert, before writing its outcome. On
CPU an op's error is always reported in-process, so one thing is made up here: the `rescued`
job's rank 1 is recorded for real, then its outcome and inputs are removed, as a dead rank
leaves them. The segfault job dies for real, in both runs: no rerun can localize it, and the
report says what each run saw."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_ranks import DISTRIBUTED, SCRIPTS, TORCHRUN_MODULE, free_port, record_job, reprocut, truth

from reprocut.localize.failure import LocalizeOptions
from reprocut.localize.job_rerun import crash_outcome
from reprocut.localize.ranks import localize_job
from reprocut.model.errors import ExitCode
from reprocut.model.job import rank_path
from reprocut.model.recording import Failure, RunDir
from reprocut.record.inside.trace import TraceWriter
from reprocut.record.parent.launch import locate, parse_launch
from reprocut.record.parent.runner import RunResult
from reprocut.record.ranks.job import (
    JobRequest,
    JobResult,
    RankRun,
    collect_ranks,
    end_ranks,
    node_id,
)


def job_command(script: Path) -> list[str]:
    port = free_port()
    return [*TORCHRUN_MODULE, "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"localhost:{port}", str(script)]  # fmt: skip


@pytest.fixture(scope="module")
def rescued(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The embedding job recorded, its rank 1 made a rank that died before reporting, then
    localized again (which reruns the job): the Failure, the progress lines, the job folder."""
    cwd = tmp_path_factory.mktemp("rescued")
    command = job_command(DISTRIBUTED / "ddp_grown_vocab" / "train.py")
    first = record_job(cwd, *command)
    assert first["_code"] == ExitCode.OK, first["_stderr"][-3000:]
    job = Path(first["run_dir"])
    dead = rank_path(job, 1)
    for name in ("record.outcome.json", "inputs.pt", "failure.json"):
        (dead / name).unlink()
    record = json.loads((dead / "rank.json").read_text())
    record.update(returncode=None, signal=11)  # as on the H200: SIGSEGV, no outcome
    (dead / "rank.json").write_text(json.dumps(record))
    launch = locate(parse_launch(["--", *command]), cwd)
    request = JobRequest(launch, RunDir(job), node_id(), timeout=120, cwd=cwd, quiet=True)
    result = JobResult(1, False, 0.0, "", "", collect_ranks(job), 2, 0, 1, request)
    assert result.ranks[1].result.outcome is None and result.ranks[1].result.signal == 11
    lines: list[str] = []
    options = LocalizeOptions(
        script=launch.script, argv=launch.args, run_dir=RunDir(job), cwd=cwd, launch=launch,
        timeout=120,
    )  # fmt: skip
    failure = localize_job(result, options, lines.append, [])
    return {"failure": failure, "lines": lines, "job": job, "cwd": cwd}


def test_a_rank_that_died_before_reporting_is_localized_by_a_rerun_of_the_job(rescued):
    failure: Failure = rescued["failure"]
    expected = truth("ddp_grown_vocab")
    assert (
        "rank 1 died before reporting (SIGSEGV); rerunning the job with rank 1 synchronized at "
        "steps 3-5 (the other ranks run plainly)" in rescued["lines"]
    )
    assert failure.status == "localized" and failure.localization == "rerun"
    assert (failure.rank, failure.op, failure.step) == (1, expected["op"], expected["step"])
    assert failure.source is not None and failure.source.line == expected["line"]
    assert failure.module == expected["module"]
    assert any("96" in fact for tensor in failure.tensors for fact in tensor.facts)
    roles = {summary.rank: (summary.role, summary.kind) for summary in failure.ranks}
    assert roles == {0: ("consequence", "collective"), 1: ("culprit", "crash")}
    (rerun,) = failure.job_reruns
    assert (rerun.rank, rerun.attempt, rerun.first_step, rerun.last_step) == (1, "localize", 3, 5)
    assert rerun.because == "rank 1 died before reporting (SIGSEGV)"
    ends = {end.rank: end for end in rerun.ranks}
    assert ends[1].reported and not ends[0].reported  # rank 0 ran plainly: no recorder
    assert RunDir(rescued["job"]).read_failure() == failure
    assert Failure.from_json(json.loads(json.dumps(failure.to_json()))) == failure


def test_the_rerun_synchronizes_one_rank_and_runs_the_others_plainly(rescued):
    job = rescued["job"]
    culprit, peer = rank_path(job, 1), rank_path(job, 0)
    config = json.loads((culprit / "localize.config.json").read_text())
    assert (config["localize_from"], config["localize_to"], config["snapshots"]) == (3, 5, False)
    assert json.loads((culprit / "rank.localize.json").read_text())["plain"] is False
    assert (culprit / "inputs.pt").exists()
    assert not (peer / "localize.config.json").exists()  # not under the recorder
    again = json.loads((peer / "rank.localize.json").read_text())
    assert again["plain"] is True
    assert "step 0 loss" in (peer / "localize.stdout.txt").read_text()  # rank 0 prints its loss
    first = json.loads((peer / "rank.json").read_text())  # the first run's files stay as they were
    assert first["plain"] is False and first["pid"] != again["pid"]
    assert (peer / "record.outcome.json").exists()
    assert json.loads((job / "rank.localize.config.json").read_text())["target"] == {
        "rank": 1,
        "attempt": "localize",
        "how": {"launch_blocking": True, "localize_from": 3, "localize_to": 5, "sync_lines": True},
    }


def test_shrink_of_the_rerun_localized_rank_is_a_verified_single_process_repro(rescued):
    job = rescued["job"]
    done = reprocut(rescued["cwd"], "shrink", "--json", str(job), "--timeout", "60")
    assert done.returncode == ExitCode.OK, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "verified" and result["signature"]["op"] == "aten::embedding"
    assert Path(result["repro"]).parent == rank_path(job, 1)
    assert "distributed" not in Path(result["repro"]).read_text()


def test_a_rank_that_dies_in_every_run_is_reported_with_what_each_run_saw(tmp_path):
    report = record_job(tmp_path, *job_command(SCRIPTS / "ddp_segfault.py"))
    assert report["_code"] == ExitCode.NOT_LOCALIZED, report["_stderr"][-3000:]
    assert "rank 1 died before reporting (SIGSEGV); rerunning the job with rank 1" in " ".join(
        report["_stderr"].split()
    )
    assert report["status"] == "not-localized" and report["rank"] == 1 and report["step"] == 5
    assert any("the localization rerun to step 5: it crashed" in n for n in report["notes"])
    assert any("the trace holds the 5 completed step(s)" in n for n in report["notes"])
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert "Fatal Python error: Segmentation fault" in by_rank[1]["stderr_tail"]
    assert "Connection" in by_rank[0]["stderr_tail"]  # its all-reduce lost rank 1
    (rerun,) = report["job_reruns"]
    ends = {end["rank"]: end for end in rerun["ranks"]}
    assert (rerun["first_step"], rerun["last_step"]) == (3, 5)
    assert ends[1]["signal"] == 11 and not ends[1]["reported"]
    assert "Segmentation fault" in ends[1]["stderr_tail"]


def _dead_rank(tmp_path: Path, healthy: list[int]) -> RankRun:
    """A rank folder whose trace holds len(healthy) steps (each noting the last step known
    complete when it ended, -1: none), and no outcome."""
    writer = TraceWriter(tmp_path / "trace.jsonl")
    for step, known in enumerate(healthy):
        writer.write_step(step, [("aten::mm", None, "forward", ())], healthy_through=known)
    writer.close()
    result = RunResult(None, 11, False, 1.0, "", "Fatal Python error: Aborted\n", None)
    return RankRun(1, tmp_path, {"rank": 1}, result)


@pytest.mark.parametrize(
    ("healthy", "step", "first_suspect"),
    [
        ([-1] * 5, 5, 3),  # nothing known complete (CPU): the last 3 steps
        ([-1, -1, 0, 1, 2], 5, 3),  # a GPU run: after the last step known complete
        ([-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 12, 5),  # long unconfirmed: 8 steps at most
        ([], 0, 0),  # died in its first step
    ],
)
def test_the_rerun_window_ends_at_the_step_the_dead_rank_was_in(
    tmp_path, healthy, step, first_suspect
):
    outcome = crash_outcome(_dead_rank(tmp_path, healthy))
    assert outcome["step"] == step
    assert min(step, outcome["healthy_through"] + 1) == first_suspect  # as rerun.py reads it
    assert outcome["error"]["type"] == "Crash" and "Aborted" in outcome["error"]["message"]
    assert f"after {step} completed step(s)" in outcome["error"]["message"]


def running(pid: int, command: list[str]) -> None:
    """Wait until `pid` shows `command` in /proc: Popen returns once the exec has begun, and
    under load the new command line can be read empty for a moment after."""
    wanted = b"\0".join(os.fsencode(arg) for arg in command) + b"\0"
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/cmdline").read_bytes() != wanted and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_plain_rank_left_running_is_ended_with_the_job_but_not_a_stranger(tmp_path):
    """A plain rank's process is the user's script, not reprocut's: end_ranks knows it by the
    command its bootstrap started it with."""
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    plain = subprocess.Popen(command, start_new_session=True)
    stranger = subprocess.Popen([*command, "--other"], start_new_session=True)
    try:
        running(plain.pid, command)  # as a rank left running is: past its exec
        running(stranger.pid, [*command, "--other"])
        folder = rank_path(tmp_path, 0)
        folder.mkdir(parents=True)
        record = {"node": "n", "pid": stranger.pid, "child_pid": plain.pid}
        (folder / "rank.localize.json").write_text(json.dumps({**record, "child_command": command}))
        end_ranks(tmp_path, "n", "localize")
        assert plain.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None  # its pid is in the file, its command is not ours
    finally:
        for process in (plain, stranger):
            process.kill()
            process.wait()
