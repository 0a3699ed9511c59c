"""Run the user's script in a child process and survive whatever it does.

The child gets its own process group (killed whole on timeout), its environment set before CUDA
initialises, and its stdout/stderr teed to the terminal and to files: CUDA prints kernel
assertions there, not into the exception. A crash (abort, segfault, SIGKILL) is a result, not an
exception here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from reprocut import PACKAGE_DIR
from reprocut.check import lifeline
from reprocut.model.launch import Launch
from reprocut.model.recording import OUTCOME_FILE  # not from record.inside: that imports torch

PACKAGE_PARENT = os.path.dirname(PACKAGE_DIR)


@dataclass(frozen=True, slots=True)
class RunResult:
    """How one run of the script ended, and what it left in the run directory."""

    returncode: int | None
    signal: int | None
    timed_out: bool
    seconds: float
    stdout: str
    stderr: str
    outcome: dict[str, Any] | None  # the child's own report; None if it died without one
    started_at: float = 0.0  # time.time() at the child's start (the outcome's failed_at is one)

    @property
    def crashed(self) -> bool:
        return self.outcome is None and not self.timed_out


@dataclass(frozen=True, slots=True)
class RunRequest:
    script: Path
    argv: tuple[str, ...]
    run_dir: Path
    attempt: str  # "record", "localize", "localize-blocking": names the config and log files
    localize_from: int | None = None  # synchronize around every op of these steps
    localize_to: int | None = None
    snapshots: bool = True
    light_steps: bool | None = None  # see Recorder.wants_every_op; False: every op of every step
    launch_blocking: bool = False
    sync_lines: bool = False  # wait for the GPU after each user line (see line_sync)
    nan: bool = False  # a non-finite flag per step; finite checks per op in the localize window
    memory: bool = False  # who made each live storage, memory per step (record/inside/memory.py)
    timeout: float | None = None
    cwd: Path | None = None
    launch: Launch | None = None  # how it was launched: `-m`, argv[0] as typed, python options


def child_env(launch_blocking: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
    env["TORCH_COMPILE_DISABLE"] = "1"  # ops inside compiled graphs never reach the modes
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if launch_blocking:
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    return env


def run_script(
    request: RunRequest,
    *,
    echo_stdout: IO[str] | None = None,
    echo_stderr: IO[str] | None = None,
    on_line: Callable[[str], None] | None = None,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> RunResult:
    """Run the script once under the recorder; never raises for what the script does.
    `on_start` is handed the child's process as soon as it exists (a rank's bootstrap stops
    it when torchrun stops the rank)."""
    outcome_path = request.run_dir / OUTCOME_FILE
    outcome_path.unlink(missing_ok=True)
    launch = request.launch or Launch(script=request.script, args=request.argv)
    config_path = request.run_dir / f"{request.attempt}.config.json"
    config_path.write_text(
        json.dumps(
            {
                "run_dir": str(request.run_dir),
                "script": str(request.script),
                "argv": list(request.argv),
                "localize_from": request.localize_from,
                "localize_to": request.localize_to,
                "snapshots": request.snapshots,
                "light_steps": request.light_steps,
                "sync_lines": request.sync_lines,
                "module": launch.module,
                "argv0": launch.argv0 or str(request.script),
                "nan": request.nan,
                "memory": request.memory,
                "parent_pid": os.getpid(),  # the child ends its group once this pid is gone
            }
        )
    )
    start, started_at = time.monotonic(), time.time()
    process = subprocess.Popen(
        [
            sys.executable,
            *launch.python_options,
            "-m",
            "reprocut.record.inside.child",
            str(config_path),
        ],
        cwd=request.cwd,
        env=child_env(request.launch_blocking),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    if on_start is not None:
        on_start(process)
    stdout_log = request.run_dir / f"{request.attempt}.stdout.txt"
    stderr_log = request.run_dir / f"{request.attempt}.stderr.txt"
    pumps = [
        _tee(process.stdout, stdout_log, echo_stdout, on_line),
        _tee(process.stderr, stderr_log, echo_stderr, on_line),
    ]
    timed_out = False
    try:
        with lifeline.owned(process.pid):
            process.wait(timeout=request.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process)
    except KeyboardInterrupt:
        _kill_group(process)
        raise
    for pump in pumps:
        pump.join(timeout=5)
    seconds = time.monotonic() - start
    returncode = process.returncode
    outcome = None
    if outcome_path.exists():
        try:
            outcome = json.loads(outcome_path.read_text())
        except json.JSONDecodeError:
            outcome = None
        outcome_path.rename(request.run_dir / f"{request.attempt}.outcome.json")
    return RunResult(
        returncode=returncode if returncode is not None and returncode >= 0 else None,
        signal=-returncode if returncode is not None and returncode < 0 else None,
        timed_out=timed_out,
        seconds=seconds,
        stdout=stdout_log.read_text(errors="replace"),
        stderr=stderr_log.read_text(errors="replace"),
        outcome=outcome,
        started_at=started_at,
    )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _tee(
    stream: IO[bytes] | None,
    log: Path,
    echo: IO[str] | None,
    on_line: Callable[[str], None] | None,
) -> threading.Thread:
    def pump() -> None:
        assert stream is not None
        with log.open("w") as out:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace")
                out.write(line)
                out.flush()
                if echo is not None:
                    echo.write(line)
                    echo.flush()
                if on_line is not None:
                    on_line(line)
        stream.close()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread
