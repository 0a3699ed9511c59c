"""Run shrinkray, the generic reducer the benchmarks compare against, under a hard time limit."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

# the shrinkray to run: `$SHRINKRAY` (e.g. one installed for another Python), else the one on PATH
SHRINKRAY = os.environ.get("SHRINKRAY", "shrinkray")


def installed() -> bool:
    return shutil.which(SHRINKRAY) is not None


def version() -> str:
    """The version of the shrinkray that runs (it may run under another Python than this)."""
    try:
        done = subprocess.run([SHRINKRAY, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "(not installed)"
    return done.stdout.strip().split()[-1] if done.returncode == 0 else "0.0.x"


@functools.cache
def _help() -> str:
    """shrinkray's --help, read once: each case asks it what it writes and knows."""
    done = subprocess.run([SHRINKRAY, "--help"], capture_output=True, text=True, timeout=60)
    return done.stdout


def _writes_a_target() -> bool:
    """shrinkray 0.0.x writes its result to `--target`; later versions reduce the file in place
    (and need `--ui basic` without a terminal)."""
    return "--target" in _help()


def _options_it_has(*options: str) -> list[str]:
    """The options this shrinkray knows: 26.7 dropped `--no-clang-delta` and exits 2 (usage)
    at the sight of it, which ended every H200 run in 1.5 s."""
    known = _help()
    return [option for option in options if option in known]


def run_shrinkray(
    test: Path, source: Path, target: Path, cwd: Path, time_limit: float, timeout: float
) -> tuple[float, str]:
    """shrinkray reducing `source` into `target` with the interestingness `test` (the candidate
    on stdin), in its own process group, killed whole at the limit: (seconds, how it ended).

    `target` exists afterwards only when shrinkray found a reduction (the newer in-place
    versions write each improvement as they go, so a run stopped at the limit keeps its best).
    """
    common = ["--timeout", str(timeout), "--parallelism", "1"]
    if _writes_a_target():
        arguments = [*common, "--target", str(target), str(test), str(source)]
        work = None
    else:
        work = target.with_name(f".work-{target.name}")
        shutil.copyfile(source, work)
        arguments = [*common, "--ui", "basic", "--input-type", "stdin",
                     *_options_it_has("--no-clang-delta"),
                     "--backup", str(work) + ".bak", str(test), str(work)]  # fmt: skip
    seconds, status = _run(arguments, cwd, time_limit, target.with_name(f"{target.name}.log"))
    if work is not None:
        if work.read_bytes() != source.read_bytes():
            shutil.copyfile(work, target)
        work.unlink(missing_ok=True)
    return seconds, status


def _run(arguments: list[str], cwd: Path, time_limit: float, log: Path) -> tuple[float, str]:
    """shrinkray's output goes to `log`; an exit with an error says so, with its last line (on
    the H200 it once ended in 1.5 s on every case, and nothing told why)."""
    started = time.perf_counter()
    with log.open("wb") as output:
        process = subprocess.Popen(
            [SHRINKRAY, *arguments],
            cwd=cwd,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=time_limit)
            status = "finished" if code == 0 else f"exited {code}: {_last_line(log)}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = "stopped at the time limit"
    return time.perf_counter() - started, status


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"
