"""`reprocut record -- torchrun ...` on CPU: the real torchrun, 2 ranks over gloo, the DDP cases of
corpus/distributed/ scored against their ground truth (rank, op, line, step), a two-"node" job
on one machine (its script run as `torchrun -m`), a job that hangs (whose ranks see the sys.argv,
sys.path[0] and `-u` torchrun gives them); `reprocut shrink` of the culprit rank, and `record
--shrink` of a job, write a single-process repro.py that fails under plain `python`. Each torchrun run costs seconds of torch imports, so
the recordings are module fixtures shared by the assertions."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tomllib
from rich.console import Console

from reprocut.localize.ranks import RankEvidence, choose_culprit, evidence, summarize
from reprocut.model.errors import ExitCode
from reprocut.model.job import rank_path
from reprocut.model.launch import Launch, LaunchError
from reprocut.model.recording import Failure, RunDir
from reprocut.record.parent.launch import parse_launch, torchrun_prefix
from reprocut.record.parent.runner import RunResult
from reprocut.record.ranks.job import RankRun
from reprocut.report.display.failure import failure_panel

REPO = Path(__file__).resolve().parents[1]
DISTRIBUTED = REPO / "corpus" / "distributed"
SCRIPTS = Path(__file__).parent / "scripts"
TORCHRUN_MODULE = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def reprocut(
    cwd: Path, *args: str, timeout: float = 300, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`reprocut ARGS` in `cwd`; `env` adds to the environment (None: removes the variable)."""
    merged: dict[str, str | None] = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "reprocut", *args],
        cwd=cwd,
        env={name: value for name, value in merged.items() if value is not None},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def record_job(
    cwd: Path,
    *command: str,
    options: tuple[str, ...] = (),
    env: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    done = reprocut(cwd, "record", "--json", "--quiet", *options, "--", *command, env=env)
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    return {**report, "_code": done.returncode, "_stderr": done.stderr}


def truth(name: str) -> dict[str, Any]:
    folder = DISTRIBUTED / name
    data = tomllib.loads((folder / "case.toml").read_text())
    marker = [
        number
        for number, line in enumerate((folder / "train.py").read_text().splitlines(), start=1)
        if "# reprocut: culprit" in line
    ]
    assert len(marker) == 1
    return {**data["expected"], "line": marker[0], "script": folder / "train.py", **data}


def assert_matches_truth(report: dict[str, Any], name: str) -> None:
    expected = truth(name)
    assert report["_code"] == ExitCode.OK, report["_stderr"][-3000:]
    assert report["status"] == "localized"
    assert report["rank"] == expected["rank"]
    assert report["world_size"] == 2
    assert report["op"] == expected["op"]
    assert report["public_call"] == expected["public_call"]
    assert report["step"] == expected["step"]
    assert report["phase"] == expected["phase"]
    assert report["module"] == expected["module"]
    assert report["source"]["file"] == str(expected["script"])
    assert report["source"]["line"] == expected["line"]
    assert report["signature"]["kind"] == expected["cpu"]["kind"]
    assert report["error"]["type"] == expected["cpu"]["error_type"]
    assert any(fact in " ".join(report["facts"]) for fact in expected["capture"]["facts"])
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[expected["rank"]]["status"] == "culprit"
    other = by_rank[1 - expected["rank"]]
    assert other["status"] == "consequence", other
    assert other["kind"] in ("collective", "terminated"), other
    if other["kind"] == "collective":
        assert other["seconds_after_culprit"] >= 0


@pytest.fixture(scope="module")
def vocab_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The embedding case through the `torchrun` command, asking for restarts."""
    cwd = tmp_path_factory.mktemp("vocab")
    script = str(DISTRIBUTED / "ddp_grown_vocab" / "train.py")
    return record_job(cwd, "torchrun", "--nproc-per-node", "2", "--max-restarts", "2", script)


@pytest.fixture(scope="module")
def label_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The cross-entropy case through `python -m torch.distributed.run`, its own rendezvous,
    shrunk in the same command (`record --shrink`)."""
    cwd = tmp_path_factory.mktemp("label")
    script = str(DISTRIBUTED / "ddp_label_shard" / "train.py")
    return record_job(
        cwd,
        *TORCHRUN_MODULE,
        "--nproc_per_node=2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{free_port()}",
        script,
        "--epochs",
        "2",
        options=("--shrink",),
    )


def test_embedding_fault_on_rank_1_is_localized_to_its_op_line_and_step(vocab_job):
    assert_matches_truth(vocab_job, "ddp_grown_vocab")


def test_cross_entropy_fault_on_rank_0_is_localized_to_its_op_line_and_step(label_job):
    assert_matches_truth(label_job, "ddp_label_shard")


def test_record_shrink_of_a_job_writes_the_culprit_ranks_verified_repro(label_job):
    shrink = label_job["shrink"]
    assert shrink["status"] == "verified", shrink
    assert shrink["signature"]["op"] == truth("ddp_label_shard")["op"]
    assert Path(shrink["repro"]).parent == rank_path(Path(label_job["run_dir"]), 0)
    assert "init_process_group" not in Path(shrink["repro"]).read_text()


def test_every_rank_records_into_its_own_folder(vocab_job):
    job = Path(vocab_job["run_dir"])
    for rank in (0, 1):
        folder = rank_path(job, rank)
        record = json.loads((folder / "rank.json").read_text())
        assert record["rank"] == rank and record["world_size"] == 2 and record["restart"] == 0
        outcome = json.loads((folder / "record.outcome.json").read_text())
        assert "early" not in outcome  # the final outcome replaced the one written at the fault
        assert RunDir(folder).read_trace() is not None
        steps = [r for r in RunDir(folder).read_trace() if r.get("type") == "step"]
        assert len(steps) == 5  # both ranks completed the 5 steps before rank 1's fault
    culprit = RunDir(rank_path(job, 1)).read_failure()
    assert culprit.rank == 1 and culprit.op == "aten::embedding"
    assert (rank_path(job, 1) / "inputs.pt").exists()
    assert RunDir(job).read_failure() == culprit  # the job folder holds the culprit's failure
    assert json.loads((job / "meta.json").read_text())["culprit_rank"] == 1
    assert not (job / "restarts").exists()


def test_torchrun_restarts_are_turned_off_with_a_message(vocab_job):
    assert any("--max-restarts 2 is set to 0" in note for note in vocab_job["notes"])
    assert "--max-restarts 2 is set to 0" in vocab_job["_stderr"]


def test_the_report_names_the_rank_and_each_other_ranks_part(vocab_job):
    job = RunDir(Path(vocab_job["run_dir"]))
    console = Console(record=True, width=120, force_terminal=False)
    console.print(failure_panel(job.read_failure(), job.path))
    text = console.export_text()
    assert "on rank 1" in text and "rank     1 of 2" in text
    assert "rank 0: " in text and "a consequence of rank 1" in text


def test_shrink_of_the_job_writes_a_single_process_repro_that_fails_plainly(vocab_job, tmp_path):
    job = Path(vocab_job["run_dir"])
    done = reprocut(job.parent.parent.parent, "shrink", "--json", str(job), "--timeout", "60")
    assert done.returncode == ExitCode.OK, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "verified"
    assert result["signature"]["op"] == "aten::embedding"
    repro = Path(result["repro"])
    assert repro.parent == rank_path(job, 1)
    code = repro.read_text()
    assert "distributed" not in code and "init_process_group" not in code
    alone = tmp_path / "repro.py"
    alone.write_text(code)
    plain = subprocess.run(
        [sys.executable, str(alone)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert plain.returncode != 0
    assert "IndexError" in plain.stderr and "index out of range in self" in plain.stderr
    assert "rank 1 of 2" in (rank_path(job, 1) / "report.md").read_text()


def test_two_nodes_on_one_machine_share_one_recording_and_one_answer(tmp_path):
    """Run from corpus/distributed/ as `torchrun -m ddp_grown_vocab.train`, recorded into
    tmp_path (no bytecode written into the corpus)."""
    port = free_port()

    def node(rank: int) -> dict[str, Any]:
        return record_job(
            DISTRIBUTED,
            *TORCHRUN_MODULE,
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"localhost:{port}",
            "--rdzv-id",
            "two-nodes",
            "-m",
            "ddp_grown_vocab.train",
            options=("--root", str(tmp_path / ".reprocut")),
            env={"PYTHONDONTWRITEBYTECODE": "1"},
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = list(pool.map(node, (0, 1)))
    for report in reports:
        assert_matches_truth(report, "ddp_grown_vocab")
    assert reports[0]["run_dir"] == reports[1]["run_dir"]
    nodes = list((Path(reports[0]["run_dir"]) / "nodes").glob("*.json"))
    assert len(nodes) == 2


def test_a_hung_job_is_ended_at_timeout_every_rank_with_it(tmp_path):
    (tmp_path / "jobs").mkdir()
    shutil.copy(SCRIPTS / "ddp_hang.py", tmp_path / "jobs" / "hang.py")
    report = record_job(
        tmp_path,
        *TORCHRUN_MODULE,
        "--nproc-per-node",
        "2",
        "jobs/hang.py",  # relative, as typed: torchrun hands it on so
        "--steps",
        "3",
        options=("--timeout", "15"),
        env={"PYTHONUNBUFFERED": None},  # so that only torchrun's `-u` makes stdout unbuffered
    )
    assert report["_code"] == ExitCode.TIMEOUT, report["_stderr"][-3000:]
    assert report["status"] == "script-timeout"
    assert "reprocut ended every rank" in report["message"]
    job = RunDir.latest(tmp_path / ".reprocut").path
    for rank in (0, 1):
        record = json.loads((rank_path(job, rank) / "rank.json").read_text())
        for pid in (record["pid"], record["child_pid"]):
            assert not _alive(pid), f"rank {rank} process {pid} outlived the job"
        seen = json.loads((tmp_path / f"seen-{rank}.json").read_text())
        assert seen == {  # what plain `torchrun ... jobs/hang.py --steps 3` gives each rank
            "argv": ["jobs/hang.py", "--steps", "3"],
            "path0": str(tmp_path / "jobs"),
            "name": "__main__",
            "unbuffered": True,
        }


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# --- the launcher's command line, and the choice of culprit, without running a job ---------------


def test_launchers_are_recognized_and_split_where_torchrun_splits():
    script = str(DISTRIBUTED / "ddp_grown_vocab" / "train.py")
    assert torchrun_prefix(["torchrun", "x.py"]) == 1
    assert torchrun_prefix(["python3", "-u", "-m", "torch.distributed.run", "x.py"]) == 4
    assert torchrun_prefix([sys.executable, "-mtorch.distributed.run", "x.py"]) == 2
    assert torchrun_prefix(["python", "train.py"]) == torchrun_prefix(["train.py"]) == 0
    assert torchrun_prefix(["python", "-m", "pkg.train"]) == 0
    launch = parse_launch(
        ["--", *TORCHRUN_MODULE, "--nproc_per_node=2", "--nnodes", "1:2", "--", script, "-s", "3"]
    )
    torchrun = launch.torchrun
    assert torchrun is not None
    assert torchrun.options == ("--nproc_per_node=2", "--nnodes", "1:2")
    assert launch == Launch(  # each rank: `python -u SCRIPT ARGS`, as torchrun starts it
        script=Path(script),
        args=("-s", "3"),
        argv0=script,
        python_options=("-u",),
        torchrun=torchrun,
    )
    assert (torchrun.min_nodes, torchrun.max_nodes) == (1, 2) and torchrun.multi_node
    assert torchrun.command(Path("/j/rank.config.json")) == [
        *torchrun.launcher,
        *torchrun.options,
        "--max-restarts",
        "0",
        "--module",
        "reprocut.record.ranks.rank",
        "/j/rank.config.json",
    ]


def test_torchrun_dash_m_runs_a_module_on_every_rank():
    launch = parse_launch(["--", "torchrun", "--nproc-per-node", "2", "-m", "pkg.train", "--lr"])
    assert launch.torchrun is not None and launch.torchrun.options == (
        "--nproc-per-node",
        "2",
        "-m",
    )
    assert (launch.module, launch.script, launch.args) == ("pkg.train", None, ("--lr",))
    assert launch.python_options == ("-u",)


@pytest.mark.parametrize("flag", [["--no-python"], ["--run-path"]], ids=["no-python", "run-path"])
def test_launch_forms_reprocut_cannot_record_are_refused_clearly(flag):
    with pytest.raises(LaunchError) as error:
        parse_launch(["--", "torchrun", *flag, str(SCRIPTS / "passes.py")])
    assert error.value.hint


def test_the_legacy_launch_module_is_refused_with_a_hint():
    with pytest.raises(LaunchError, match=r"torch\.distributed\.launch"):
        parse_launch(
            ["--", sys.executable, "-m", "torch.distributed.launch", str(SCRIPTS / "passes.py")]
        )


def test_a_missing_training_script_is_a_usage_error(tmp_path):
    done = reprocut(tmp_path, "record", "--", "torchrun", "--nproc-per-node", "2", "nope.py")
    assert done.returncode == ExitCode.USAGE_ERROR
    assert "no such script: nope.py" in done.stderr


def _rank(
    tmp_path: Path, rank: int, outcome: dict[str, Any] | None, stderr: str = "", **record: Any
) -> RankRun:
    folder = tmp_path / str(rank)
    folder.mkdir(exist_ok=True)
    result = RunResult(
        returncode=record.pop("returncode", 1),
        signal=record.pop("signal", None),
        timed_out=False,
        seconds=1.0,
        stdout="",
        stderr=stderr,
        outcome=outcome,
    )
    return RankRun(rank, folder, {"rank": rank, "ended": 100.0 + rank, **record}, result)


def _failed(error_type: str, message: str, at: float, op: str | None = None) -> dict[str, Any]:
    culprit = {"op": op, "public_call": None, "synchronized": True} if op else None
    return {
        "status": "failed",
        "error": {"type": error_type, "message": message, "code": None},
        "failed_at": at,
        "step": 3,
        "culprit": culprit,
    }


def test_the_first_rank_failing_on_its_own_is_the_culprit_not_the_first_to_exit(tmp_path):
    ranks = [
        evidence(
            _rank(
                tmp_path, 0, _failed("RuntimeError", "[pair.cc:553] Connection closed by peer", 1.0)
            )
        ),
        evidence(
            _rank(
                tmp_path,
                1,
                _failed("IndexError", "index out of range in self", 2.0, "aten::embedding"),
            )
        ),
        evidence(_rank(tmp_path, 2, None, signal=15, terminated_by="SIGTERM", terminated_at=3.0)),
        evidence(_rank(tmp_path, 3, {"status": "passed", "exit_code": 0, "step": 3})),
    ]
    assert [e.kind for e in ranks] == ["collective", "fault", "terminated", "passed"]
    culprit = choose_culprit(ranks)
    assert culprit is not None and culprit.rank == 1
    roles = [s.role for s in summarize(ranks, culprit, 5)]
    assert roles == ["consequence", "culprit", "consequence", "passed", "unknown"]


def test_when_every_rank_fails_the_same_way_the_first_is_reported(tmp_path):
    ranks = [
        evidence(
            _rank(
                tmp_path,
                r,
                _failed("IndexError", "index out of range in self", at, "aten::embedding"),
            )
        )
        for r, at in ((0, 5.2), (1, 5.1), (2, 5.3))
    ]
    culprit = choose_culprit(ranks)
    assert culprit is not None and culprit.rank == 1
    assert {s.role for s in summarize(ranks, culprit, 3) if s.rank != 1} == {"same-failure"}


def test_device_evidence_outranks_a_collective_message(tmp_path):
    assertion = (
        "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1422: indexSelectLargeIndex: block: "
        "[0,0,0], thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n"
    )
    cuda = evidence(
        _rank(
            tmp_path,
            0,
            _failed(
                "RuntimeError", "ProcessGroupGloo: CUDA error: device-side assert triggered", 9.0
            ),
            assertion,
        )
    )
    crashed = evidence(_rank(tmp_path, 1, None, signal=6))
    peer = evidence(
        _rank(tmp_path, 2, _failed("DistBackendError", "NCCL error: remote process exited", 1.0))
    )
    assert (cuda.kind, crashed.kind, peer.kind) == ("fault", "crash", "collective")
    assert choose_culprit([peer, cuda]) is cuda


def test_a_job_where_no_rank_fails_has_no_culprit(tmp_path):
    passed = [evidence(_rank(tmp_path, r, {"status": "passed", "exit_code": 0})) for r in (0, 1)]
    assert choose_culprit(passed) is None
    assert isinstance(passed[0], RankEvidence) and passed[0].kind == "passed"


def test_a_failure_with_ranks_round_trips_through_json(vocab_job):
    failure = RunDir(Path(vocab_job["run_dir"])).read_failure()
    assert failure.rank == 1 and failure.world_size == 2 and len(failure.ranks) == 2
    assert Failure.from_json(json.loads(json.dumps(failure.to_json()))) == failure


def test_torchruns_signal_during_a_write_of_rank_json_leaves_the_newest_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bootstrap's signal handler runs inside the main thread, possibly in the middle of
    its write of rank.json: that write once ended as half of each record. Now the handler's
    write is left to the one it interrupted, which writes again."""
    from reprocut.record.ranks import rank as rank_module

    process = rank_module.RankProcess(tmp_path, {"rank": 0, "terminated_by": None})
    real = rank_module.atomic_write
    texts: list[str] = []

    def interrupted(path: Path, text: str) -> None:
        texts.append(text)
        if len(texts) == 1:  # torchrun's SIGTERM arrives while this write is under way
            process.record["terminated_by"] = "SIGTERM"
            process.write()
        real(path, text)

    monkeypatch.setattr(rank_module, "atomic_write", interrupted)
    process.record["ended"] = 1.0
    process.write()
    written = json.loads((tmp_path / "rank.json").read_text())
    assert written == {"rank": 0, "terminated_by": "SIGTERM", "ended": 1.0}
    assert len(texts) == 2
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind
