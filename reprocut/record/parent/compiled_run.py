"""The script run once more as the user ran it: torch.compile on, no reprocut code in it.

The recording runs with TORCH_COMPILE_DISABLE=1 (ops inside compiled graphs never reach the
dispatch modes), so what the compiler does is only seen here: a plain `python SCRIPT ARGS` (or
`python -m MODULE`) in its own process group, with a timeout, its output kept in the run folder.
A C++ exception from an Inductor CPU kernel can abort the process (SIGABRT, "terminate called",
no Python traceback): that is a crash, read as any other.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from reprocut.check import lifeline
from reprocut.check.fresh import run_with_timeout
from reprocut.check.verify import last_exception
from reprocut.model.compiled import CompiledRun, compile_environment, inductor_evidence
from reprocut.model.launch import Launch

LOG = "compiled.stderr.txt"  # in the run folder, beside record's own logs
NO_LIMIT = 7 * 24 * 3600.0  # record without --timeout: the run may take as long as it takes


def run_compiled(
    launch: Launch, cwd: Path, run_dir: Path, timeout: float | None = None
) -> CompiledRun:
    """Run the script plainly, compiled; never raises for what the script does."""
    assert launch.script is not None
    target = ["-m", launch.module] if launch.module else [launch.argv0 or str(launch.script)]
    started = time.monotonic()
    log = run_dir / LOG
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, *launch.python_options, *target, *launch.args],
            cwd=cwd,
            env=compile_environment(compiled=True),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        with lifeline.owned(process.pid):
            returncode = run_with_timeout(process, timeout or NO_LIMIT)
    output = log.read_text(errors="replace")
    return read_compiled(output, returncode, time.monotonic() - started)


def read_compiled(output: str, returncode: int | None, seconds: float) -> CompiledRun:
    """What a compiled run's stderr and exit code say."""
    kernel, assertion, kernel_file = inductor_evidence(output)
    found = last_exception(output)
    if returncode is None:
        return CompiledRun(
            True, None, "", None, False, True, kernel, assertion, kernel_file, seconds
        )
    if returncode == 0:
        return CompiledRun(False, seconds=seconds)
    if found is None or returncode < 0:  # killed by a signal, or no traceback: a crash
        message = _terminate_message(output)
        return CompiledRun(
            True, None, message, returncode, True, False, kernel, assertion, kernel_file, seconds
        )
    error_type, message = found
    return CompiledRun(
        True, error_type, message, returncode, False, False, kernel, assertion, kernel_file, seconds
    )


def _terminate_message(output: str) -> str:
    """What a C++ abort printed: "terminate called after throwing ... what(): ..."."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("terminate called"):
            return "\n".join(lines[i : i + 3]).strip()
    return ""
