"""The oracle's fresh-process mode: each check in a new interpreter (no shared parent at all).

Slower than the fork server's children (torch is imported every time), for when forking is
unsafe or not wanted (`--no-fork`). `run_with_timeout` waits for a process group and kills it
whole on timeout (plain verification runs use it too).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reprocut.check import lifeline
from reprocut.check.forkchild import read_output


def run_fresh(request: dict[str, Any], workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    """One request in a fresh `python -m reprocut.check.forkserver --once`: the reply a server
    would give. Its files go to a folder of its own in `workdir` (checks may run side by side)."""
    with tempfile.TemporaryDirectory(prefix="fresh-", dir=workdir) as folder:
        return _run_fresh_in(request, Path(folder), env)


def _run_fresh_in(request: dict[str, Any], workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    request_path = workdir / "request.json"
    verdict_path = workdir / "verdict.json"
    out_path, err_path = workdir / "fresh-stdout.txt", workdir / "fresh-stderr.txt"
    request_path.write_text(json.dumps(request))
    verdict_path.unlink(missing_ok=True)
    started = time.perf_counter()
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "reprocut.check.forkserver", "--once", str(request_path),
             "--verdict", str(verdict_path), "--parent", str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            env=env,
            cwd=request["cwd"], start_new_session=True,
        )  # fmt: skip
        with lifeline.owned(process.pid):
            returncode = run_with_timeout(process, request["timeout"])
    reply: dict[str, Any] = {
        "seconds": time.perf_counter() - started,
        "stdout": read_output(out_path),
        "stderr": read_output(err_path),
        "returncode": returncode,
    }
    if returncode is None:
        reply["outcome"] = "timeout"
    elif verdict_path.exists():
        reply["outcome"] = "done"
        reply["verdict"] = json.loads(verdict_path.read_text())
    else:
        reply["outcome"] = "crashed"
    return reply


def run_with_timeout(process: subprocess.Popen[Any], timeout: float) -> int | None:
    """Wait for a process started with start_new_session; kill its whole group on timeout."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # leftovers of the group
