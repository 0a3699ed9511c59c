"""Run shrinkray, the generic reducer the benchmarks compare against, under a hard time limit."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def run_shrinkray(arguments: list[str], cwd: Path, time_limit: float) -> tuple[float, str]:
    """shrinkray in its own process group, killed whole at the limit: (seconds, how it ended)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        ["shrinkray", *arguments],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        process.wait(timeout=time_limit)
        status = "finished"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status = "stopped at the time limit"
    return time.perf_counter() - started, status
