"""Does the final repro.py fail the same way under a plain `python repro.py`, every time?

Each run is a fresh process (own process group, timeout) with no reprocut code in it, so the
signature is read back from the traceback on stderr. A plain run has no attribution, so the op is
not compared (the error type or CUDA code and the normalized message or assertion kind are).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reprocut.check import lifeline
from reprocut.check.oracle import run_with_timeout
from reprocut.model.case import Signature
from reprocut.model.errors import ExitCode
from reprocut.model.signature import classify, crash_signature, last_exception

DEVICE_BUSY = "busy or unavailable"  # "CUDA-capable device(s) is/are busy or unavailable"


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """One plain run: its exit code (None on timeout) and the signature its traceback shows."""

    returncode: int | None
    signature: Signature | None
    seconds: float
    stderr_tail: str


@dataclass(frozen=True, slots=True)
class Verification:
    runs: int
    reproduced: int
    outcomes: tuple[RunOutcome, ...]

    @property
    def rate(self) -> float:
        return self.reproduced / self.runs if self.runs else 0.0

    @property
    def exit_code(self) -> ExitCode:
        if self.runs and self.reproduced == self.runs:
            return ExitCode.OK
        return ExitCode.FLAKY if self.reproduced else ExitCode.NOT_REPRODUCED

    def describe(self) -> str:
        return f"{self.reproduced}/{self.runs} plain runs failed with the expected signature"


def signature_from_stderr(stderr: str) -> Signature | None:
    found = last_exception(stderr)
    if found is None:
        return None
    error_type, message = found
    return classify(error_type, message, stderr)


def run_plain(
    script: Path,
    *,
    argv: Sequence[str] = (),
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> RunOutcome:
    """`python script argv...` from `cwd` (the script's folder by default: then as
    `python repro.py` there), in its own process group (`env`: its environment, this
    process's by default)."""
    started = time.perf_counter()
    folder = script.parent if cwd is None else Path(cwd)
    name = script.name if folder.resolve() == script.parent.resolve() else str(script.resolve())
    process = subprocess.Popen(
        [sys.executable, name, *argv],
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    stderr_bytes = b""
    try:
        with lifeline.owned(process.pid):
            _, stderr_bytes = process.communicate(timeout=timeout)
        returncode: int | None = process.returncode
    except subprocess.TimeoutExpired:
        returncode = run_with_timeout(process, 0)  # kills the group
        returncode = None
    stderr = stderr_bytes.decode("utf-8", "replace")
    signature = signature_from_stderr(stderr)
    if signature is None and returncode:  # died without a traceback: a crash
        signature = crash_signature(returncode)
    return RunOutcome(returncode, signature, time.perf_counter() - started, stderr[-4000:])


class Standby(Protocol):
    """A fresh interpreter started ahead (reprocut.check.plainrun): it has imported torch,
    nothing else, and runs one script as `__main__` when asked."""

    def run(self, script: Path, argv: Sequence[str], cwd: Path, timeout: float) -> RunOutcome: ...


def verify(
    script: Path,
    expected: Signature,
    *,
    runs: int = 3,
    timeout: float = 120.0,
    parallel: bool = True,
    env: dict[str, str] | None = None,
    standbys: Sequence[Standby] = (),
) -> Verification:
    """Run `script` `runs` times; count the runs whose signature matches `expected` (op aside).

    The runs are independent processes, so by default they run side by side (each still a
    fresh `python script`, each with its own timeout): the wait is one run's, not `runs`'.
    `standbys`: interpreters started while the shrink ran, one per run, each used once, for a
    script whose first statement is `import torch` (the caller asks
    reprocut.check.plainrun.starts_by_importing_torch): importing it ahead changes nothing the
    script sees, and saves each run that import."""
    outcomes: tuple[RunOutcome, ...] = ()
    if parallel and runs > 1:
        script = script.resolve()
        ready = list(standbys[:runs])

        def one(index: int) -> RunOutcome:
            if index < len(ready):  # as run_plain runs it: `python repro.py` from its folder
                return ready[index].run(Path(script.name), (), script.parent, timeout)
            return run_plain(script, timeout=timeout, env=env)

        with ThreadPoolExecutor(max_workers=runs) as pool:
            outcomes = tuple(pool.map(one, range(runs)))
    if not outcomes or any(DEVICE_BUSY in outcome.stderr_tail for outcome in outcomes):
        # a GPU in exclusive-process mode gives one process at a time: one after another, then
        outcomes = tuple(run_plain(script, timeout=timeout, env=env) for _ in range(runs))
    reproduced = sum(
        1
        for outcome in outcomes
        if outcome.signature is not None and outcome.signature.matches(expected, compare_op=False)
    )
    return Verification(runs, reproduced, outcomes)
