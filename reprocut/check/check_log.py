"""A JSON line per check, pass and phase, for seeing where a slow shrink's time goes.

Set REPROCUT_CHECK_LOG=FILE and every check the oracle runs (forked or fresh, with its
seconds and verdict), every plain-run confirmation, every pass the reducers start, every
candidate they accept (with its text), the rules a script reduction holds its candidates to,
every phase of the shrink, every memcheck run (in a process started
ahead or not), every check begun ahead for a later pass and taken by it, and every merge of
candidates beside a taken one is appended to FILE as it happens, stamped with the wall clock,
process and thread. Off (and free) when the variable is unset; lines from
several processes may share one file (each line is one `write`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

LOG_ENV = "REPROCUT_CHECK_LOG"

_lock = threading.Lock()


def enabled() -> bool:
    return bool(os.environ.get(LOG_ENV))


def log(kind: str, **fields: Any) -> None:
    """Append one event (`kind`: command (its start and exit), check, plain, pass, accepted,
    phase, memcheck, ahead, adopted, merge) when the log is on."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = {
        "t": round(time.time(), 3),
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "kind": kind,
        **fields,
    }
    text = json.dumps(line, default=str) + "\n"
    with _lock:
        try:
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(text)
        except OSError:  # a log that cannot be written must not fail the shrink
            pass


def log_check(
    verdict: Any, reply: dict[str, Any], seconds: float, waited: float, code: str, **fields: Any
) -> None:
    """One check's line: its seconds (`waited` of them for a machine slot, `child_seconds` in
    the process that ran it), its verdict, the candidate's lines and text (`code`: what a new
    static rule is held against afterwards, benchmarks/rule_audit.py), and for a failure that
    is not the expected one what it was (`failed`), which says what a pass's wasted checks
    broke."""
    if not enabled():
        return
    signature = getattr(verdict, "signature", None)
    if type(verdict).__name__ == "OtherFailure" and signature is not None:
        fields["failed"] = f"{signature.error_type}: {signature.kind}"[:200]
    log(
        "check",
        seconds=round(seconds, 3),
        waited=round(waited, 3),
        child_seconds=reply.get("seconds"),
        verdict=type(verdict).__name__,
        lines=code.count("\n") + 1,
        code=code,
        **fields,
    )
