"""The parent side of `reprocut record -- torchrun ...`: the job's folder, the real torchrun, and
every rank's result once the job has ended.

torchrun runs in a process group of its own, its output teed like a script's. Each rank's
bootstrap (rank.py) records into ranks/<rank>/ and writes rank.json, from which the rank's
RunResult is read back exactly as `run_script` returns it for one process. `--timeout` covers the
whole job: torchrun is asked to stop (it stops its ranks), then killed, and every rank process
this node started is ended. Several nodes of one job share one run folder when they share the
--root: the first to start creates it, the others join it by the job's rendezvous key, and each
waits for the others to finish before the culprit is chosen, so that all of them give one answer.

A rerun of the job (a JobRequest with a `target`) runs the same torchrun again with one rank
localizing (rank.py); its files are named by its attempt, beside the first run's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from reprocut.model.job import NODES_DIR, RESTARTS_DIR, job_config, rank_file, rank_folders
from reprocut.model.launch import Launch, TorchrunLaunch
from reprocut.model.recording import RunDir, atomic_write
from reprocut.record.parent.runner import RunResult, _tee, child_env

JOIN_WINDOW_S = 600.0  # torchrun's default rendezvous join timeout: nodes start within it
NODE_WAIT_S = 60.0  # after this node's torchrun ended: how long the other nodes may take
STOP_WAIT_S = 10.0  # after asking torchrun to stop: how long before everything is killed


@dataclass(frozen=True, slots=True)
class RankRun:
    """One rank: its folder, what its bootstrap wrote (rank.json), its RunResult."""

    rank: int
    folder: Path
    record: dict[str, Any]
    result: RunResult


@dataclass(frozen=True, slots=True)
class RankTarget:
    """In a rerun of the job: the rank that localizes, the attempt's name ("localize", ...), and
    the RunRequest fields that make the attempt what it is (localize_from, localize_to,
    launch_blocking, sync_lines, nan). The other ranks run plainly."""

    rank: int
    attempt: str
    how: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class JobRequest:
    launch: Launch  # located (its script absolute), with its `torchrun`
    run_dir: RunDir
    node: str
    snapshots: bool = True
    light_steps: bool | None = None
    timeout: float | None = None
    cwd: Path | None = None
    quiet: bool = False
    target: RankTarget | None = None  # a rerun of the job, to localize one rank's failure

    @property
    def attempt(self) -> str:
        return "record" if self.target is None else self.target.attempt


@dataclass(frozen=True, slots=True)
class JobResult:
    """How the job ended on this node, and every rank recorded in the job's folder."""

    returncode: int | None
    timed_out: bool
    seconds: float
    stdout: str  # torchrun's output: every rank of this node, interleaved
    stderr: str
    ranks: dict[int, RankRun]
    world_size: int | None
    restarts: int  # attempts torchrun restarted anyway (their ranks are never analysed)
    nodes: int  # nodes that recorded into this folder
    request: JobRequest | None = None  # what ran: a localization reruns it with a target


def node_id() -> str:
    return f"{os.uname().nodename}-{os.getpid()}"


def open_job_dir(root: Path, launch: TorchrunLaunch, node: str) -> tuple[RunDir, bool]:
    """The job's run folder, and whether this node created it (else it joined another node's)."""
    if not launch.multi_node:
        return RunDir.create(root), True
    jobs = root / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    pointer = jobs / f"{launch.job_key}.json"
    with (jobs / f"{launch.job_key}.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(pointer.read_text())
        except (OSError, json.JSONDecodeError):
            data = None
        folder = root / "runs" / data["run"] if data else None
        if (
            data is not None
            and folder is not None
            and folder.is_dir()
            and time.time() - data["created"] < JOIN_WINDOW_S
            and len(data["nodes"]) < launch.max_nodes
        ):
            data["nodes"].append(node)
            run_dir, created = RunDir.open(folder), False
            atomic_write(root / "latest", run_dir.id)
        else:
            run_dir, created = RunDir.create(root), True
            data = {"run": run_dir.id, "created": time.time(), "nodes": [node]}
        atomic_write(pointer, json.dumps(data))
        _write_node(run_dir, node, done=False)
    return run_dir, created


def _write_node(run_dir: RunDir, node: str, **fields: Any) -> None:
    nodes = run_dir.path / NODES_DIR
    nodes.mkdir(exist_ok=True)
    atomic_write(nodes / f"{node}.json", json.dumps({"node": node, **fields}))


def run_job(
    request: JobRequest,
    *,
    echo_stdout: IO[str] | None = None,
    echo_stderr: IO[str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> JobResult:
    """Run torchrun once with every rank under the recorder; never raises for what it does."""
    launch, torchrun = request.launch, request.launch.torchrun
    assert launch.script is not None and torchrun is not None
    job, attempt, target = request.run_dir.path, request.attempt, request.target
    config = job / job_config(attempt)
    atomic_write(
        config,
        json.dumps(
            {
                "job_dir": str(job),
                "script": str(launch.script),  # each rank launches as torchrun would:
                "module": launch.module,
                "argv": list(launch.args),
                "argv0": launch.argv0,
                "python_options": list(launch.python_options),
                "cwd": str(request.cwd or Path.cwd()),
                "node": request.node,
                "snapshots": request.snapshots,
                "light_steps": request.light_steps,
                "quiet": request.quiet,
                "target": None
                if target is None
                else {"rank": target.rank, "attempt": target.attempt, "how": dict(target.how)},
            }
        ),
    )
    _write_node(request.run_dir, request.node, done=False)
    start = time.monotonic()
    process = subprocess.Popen(
        torchrun.command(config),
        cwd=request.cwd,
        env=child_env(False),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    stem = "torchrun" if target is None else f"torchrun.{attempt}"
    logs = (job / f"{stem}.stdout.txt", job / f"{stem}.stderr.txt")
    pumps = [
        _tee(process.stdout, logs[0], echo_stdout, on_line),
        _tee(process.stderr, logs[1], echo_stderr, on_line),
    ]
    timed_out = False
    try:
        process.wait(timeout=request.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(process, job, request.node, attempt)
    except KeyboardInterrupt:
        _stop(process, job, request.node, attempt)
        raise
    end_ranks(job, request.node, attempt)  # a rank torchrun could not stop must not outlive it
    for pump in pumps:
        pump.join(timeout=5)
    seconds = time.monotonic() - start
    _write_node(request.run_dir, request.node, done=True, returncode=process.returncode)
    nodes = _wait_for_nodes(request.run_dir, request.timeout)
    ranks = collect_ranks(job, timed_out, attempt)
    sizes = {run.record.get("world_size") for run in ranks.values()} - {None}
    restarts = job / RESTARTS_DIR
    return JobResult(
        returncode=process.returncode,
        timed_out=timed_out,
        seconds=seconds,
        stdout=logs[0].read_text(errors="replace"),
        stderr=logs[1].read_text(errors="replace"),
        ranks=ranks,
        world_size=max(sizes) if sizes else None,
        restarts=len(list(restarts.iterdir())) if restarts.is_dir() else 0,
        nodes=nodes,
        request=request,
    )


def _stop(process: subprocess.Popen[bytes], job: Path, node: str, attempt: str) -> None:
    """Ask torchrun to stop (it stops its ranks with SIGTERM), then kill whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
    end_ranks(job, node, attempt)


def end_ranks(job: Path, node: str, attempt: str = "record") -> None:
    """SIGKILL every rank process of this node still alive (bootstraps and scripts alike)."""
    for folder in [*rank_folders(job).values(), *_restart_folders(job)]:
        record = _read_json(folder / rank_file(attempt))
        if record is None or record.get("node") != node:
            continue
        for pid in (record.get("child_pid"), record.get("pid")):
            if isinstance(pid, int) and _is_rank_process(pid, record.get("child_command")):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def _restart_folders(job: Path) -> list[Path]:
    restarts = job / RESTARTS_DIR
    return [p for p in restarts.glob("*/*") if p.is_dir()] if restarts.is_dir() else []


_EXEC_LOOKS = 50  # a second at most, for a command line not yet there


def _is_rank_process(pid: int, plain: list[str] | None = None) -> bool:
    """A live process that is reprocut's, or the plain rank it started with the command
    `plain` (never a reused pid of someone else's)."""
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        for _ in range(_EXEC_LOOKS):  # read empty for a moment just after an exec
            if cmdline:
                break
            time.sleep(0.02)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    ours = b"reprocut.record." in cmdline
    if plain:
        ours = ours or cmdline.split(b"\0")[:-1] == [os.fsencode(arg) for arg in plain]
    return ours


def _wait_for_nodes(run_dir: RunDir, timeout: float | None) -> int:
    """Wait until every node that joined this folder has ended its torchrun."""
    deadline = time.monotonic() + min(NODE_WAIT_S, timeout or NODE_WAIT_S)
    while True:
        nodes = [_read_json(p) for p in (run_dir.path / NODES_DIR).glob("*.json")]
        if all(n and n.get("done") for n in nodes) or time.monotonic() > deadline:
            return len(nodes)
        time.sleep(0.2)


def collect_ranks(
    job: Path, timed_out: bool = False, attempt: str = "record"
) -> dict[int, RankRun]:
    """Every rank of torchrun's first attempt, its RunResult read back from its folder (in a
    rerun of the job, `attempt` names the files; a rank that ran plainly has no outcome)."""
    ranks = {}
    for rank, folder in sorted(rank_folders(job).items()):
        record = _read_json(folder / rank_file(attempt))
        if record is None:
            continue
        outcome = _read_json(folder / f"{attempt}.outcome.json")
        ranks[rank] = RankRun(
            rank,
            folder,
            record,
            RunResult(
                returncode=record.get("returncode"),
                signal=record.get("signal"),
                timed_out=timed_out and outcome is None,
                seconds=record.get("seconds") or 0.0,
                stdout=_read_text(folder / f"{attempt}.stdout.txt"),
                stderr=_read_text(folder / f"{attempt}.stderr.txt"),
                outcome=outcome,
            ),
        )
    return ranks


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
