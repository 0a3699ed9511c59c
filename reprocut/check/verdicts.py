"""What a check of a candidate found: one frozen Verdict per run, never an exception.

`verdict_from_reply` turns a fork-server child's (or a fresh process's) reply into one,
comparing the failure it saw with the expected signature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reprocut.model.case import Signature
from reprocut.model.signature import CRASH, classify, crash_signature, landed_elsewhere

STDERR_TAIL = 4000


@dataclass(frozen=True, slots=True)
class Reproduced:
    """Failed with the expected signature."""

    signature: Signature
    message: str
    stderr: str
    seconds: float


@dataclass(frozen=True, slots=True)
class OtherFailure:
    """Failed, but not the same way (another exception, op or assertion)."""

    signature: Signature
    message: str
    stderr: str
    seconds: float
    line: int | None = None  # the code's module-level line it raised from (None: not known)


@dataclass(frozen=True, slots=True)
class Passed:
    seconds: float
    stdout: str = ""


@dataclass(frozen=True, slots=True)
class TimedOut:
    seconds: float


@dataclass(frozen=True, slots=True)
class Crashed:
    """The process died without a verdict (abort, segfault, os._exit)."""

    returncode: int | None
    stderr: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ForkOnly:
    """Reproduced in the fork server's child but not in a plain run of the same code: the two
    kinds of process disagree, so the candidate does not count as reproducing."""

    signature: Signature
    plain: Signature | None  # what the plain run failed with (None: it passed)
    stderr: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Killed before it finished because its verdict was no longer needed (`Ticket.cancel`)."""

    seconds: float


Verdict = Reproduced | OtherFailure | Passed | TimedOut | Crashed | ForkOnly | Cancelled
# confirm(code, filename, cwd, argv, verdict, expected) -> the verdict to return
Confirm = Callable[[str, str, str, list[str], "Verdict", "Signature | None"], "Verdict"]


def verdict_from_reply(
    reply: Mapping[str, Any],
    expected: Signature | None,
    *,
    compare_op: bool = True,
    synchronized: bool = True,
) -> Verdict:
    """Turn a server (or fresh-process) reply into a Verdict, comparing with `expected`.
    Unsynchronized, a CUDA error raises wherever the GPU is next waited for: its op is not
    compared (as plain verification compares none)."""
    seconds = float(reply.get("seconds", 0.0))
    stderr = str(reply.get("stderr", ""))
    outcome = reply.get("outcome")
    if outcome == "timeout":
        return TimedOut(seconds)
    if outcome == "cancelled":
        return Cancelled(seconds)
    if outcome != "done":
        returncode = reply.get("returncode")
        if expected is not None and expected.error_type == CRASH and returncode is not None:
            crash = crash_signature(returncode)  # a crash is what this repro must do
            if crash.matches(expected):
                return Reproduced(crash, f"the process died ({crash.kind})", _tail(stderr), seconds)
        return Crashed(returncode, _tail(stderr or reply.get("message", "")), seconds)
    verdict = reply["verdict"]
    if verdict.get("status") == "passed":
        return Passed(seconds, _tail(str(reply.get("stdout", ""))))
    error = verdict["error"]
    signature = classify(
        error["type"],
        error["message"],
        stderr,
        error.get("op") or error.get("public_call"),
        error.get("error_code"),
    )
    message = str(error["message"])
    compare_op = compare_op and (synchronized or signature.error_code is None)
    if expected is not None and (
        signature.matches(expected, compare_op=compare_op) or landed_elsewhere(signature, expected)
    ):
        return Reproduced(signature, message, _tail(stderr), seconds)
    line = verdict.get("line")
    return OtherFailure(
        signature, message, _tail(stderr), seconds, line if isinstance(line, int) else None
    )


def _tail(text: str) -> str:
    return text[-STDERR_TAIL:]
