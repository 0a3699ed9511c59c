"""Why a way of making a repro declined: what its candidate did instead of failing as recorded.

A user whose captured call "did not reproduce" needs to know what it did (it raised a NameError
because a guard was not resolved, it passed, it timed out) to trust the script reduction that
follows, or to report what reprocut got wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reprocut.check.verdicts import (
    Cancelled,
    Crashed,
    ForkOnly,
    OtherFailure,
    Passed,
    Reproduced,
    TimedOut,
    Verdict,
)
from reprocut.model.case import ReproCase
from reprocut.source.custom_ops import custom_op_name

MESSAGE_CHARS = 200  # of the error's first line, in a reason


@dataclass(frozen=True, slots=True)
class Declined:
    """A way that made no repro (`way`: "captured call", "torch.empty inputs"), and why."""

    way: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"way": self.way, "reason": self.reason}


def call_name(case: ReproCase) -> str:
    """`ns::op` for a call of `torch.ops.ns.op.overload` (aten's too), else the public name."""
    parts = case.target.split(".")
    if len(parts) >= 4 and parts[:2] == ["torch", "ops"]:
        return custom_op_name(case.target) or f"{parts[2]}::{parts[3]}"
    return case.target


def what_it_did(verdict: Verdict | None) -> str:
    """A verdict in words, as the end of "the captured call ... did not reproduce: ..."."""
    if verdict is None:
        return "it was not checked"
    if isinstance(verdict, OtherFailure):
        line = (verdict.message.strip().splitlines() or [""])[0][:MESSAGE_CHARS]
        where = f" in {verdict.signature.op}" if verdict.signature.op else ""
        return f"it raised {verdict.signature.error_type}{where}: {line}".rstrip(": ")
    if isinstance(verdict, Passed):
        return "it ran without an error"
    if isinstance(verdict, TimedOut):
        return f"it did not finish in {verdict.seconds:.0f} s"
    if isinstance(verdict, Crashed):
        tail = (verdict.stderr.strip().splitlines() or [""])[-1][:MESSAGE_CHARS]
        return f"its process died (exit code {verdict.returncode})" + (f": {tail}" if tail else "")
    if isinstance(verdict, ForkOnly):
        plain = "passed" if verdict.plain is None else f"raised {verdict.plain.describe()}"
        return f"it failed in the fork server's child only; a plain `python repro.py` {plain}"
    if isinstance(verdict, Reproduced):
        return "it reproduced in a check but not in a plain `python repro.py`"
    if isinstance(verdict, Cancelled):
        return "its check was cancelled"
    return f"it ended as {type(verdict).__name__}"


def captured_call_declined(cases: Sequence[ReproCase], verdicts: Sequence[Verdict]) -> str:
    """Why no captured call reproduced: each call and what it did (the checks ran in order,
    so a case without a verdict was not reached)."""
    said = [
        f"the captured call of `{call_name(case)}` did not reproduce: "
        f"{what_it_did(verdicts[i] if i < len(verdicts) else None)}"
        for i, case in enumerate(cases)
    ]
    return "; ".join(said)
