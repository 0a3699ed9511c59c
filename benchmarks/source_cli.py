"""A source case the way a user shrinks it: `reprocut record`, then `reprocut shrink --source`.

bench_source.py times reprocut's reducer alone, given the failing call and its probed tensors;
this runs the two commands on a copy of the case, at shrink's default settings (no
--max-time: the reduction runs to its fixed point under the safety cap), and reads the shrink's
own JSON: its wall seconds, checks, what stopped it, whether its plain runs verified the repro,
and the repro's size (non-blank lines, statements). The record is not timed: it is the run the
user had anyway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from reprocut.source.size import count_lines

ROOT = Path(__file__).resolve().parent.parent
REDUCER = "reprocut shrink --source"


def shrink_source_cli(work: Path, script: str, argv: tuple[str, ...], timeout: float,
                      max_time: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Record the script in `work` (a copy of the case), then shrink it with --source; the
    figures (`error` when a command did not give its JSON)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    record = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--quiet", "--json", script, *argv],
        cwd=work, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    limit = ["--max-time", str(max_time)] if max_time is not None else []
    started = time.perf_counter()
    shrink = subprocess.run(
        [sys.executable, "-m", "reprocut", "shrink", "--source", "--json", *limit],
        cwd=work, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    try:
        result = json.loads(shrink.stdout)
        code = Path(result["repro"]).read_text()
    except (ValueError, KeyError, OSError):
        tail = (shrink.stderr or record.stderr).strip().splitlines()[-1:]
        return {"error": f"record rc={record.returncode}, shrink rc={shrink.returncode}: {tail}"}
    verified = result.get("verified") or {}
    return {
        "seconds": round(seconds, 2),
        "reduce_seconds": (result.get("phases") or {}).get("source_reduce"),
        "checks": result.get("checks") or 0,
        "lines": count_lines(code),
        "statements": result.get("statements"),
        "stopped": result.get("stopped", ""),
        "fixed_point": result.get("fixed_point"),
        "verified": bool(verified.get("runs"))
        and verified.get("reproduced") == verified.get("runs"),
        "runs": f"{verified.get('reproduced', 0)}/{verified.get('runs', 0)}",
        "passes": result.get("passes") or {},
        "code": code,
    }
