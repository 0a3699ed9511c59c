"""repro.py written ▶ verified by plain runs, report.md written, the result as data.

Verification is the final word: fresh `python repro.py` processes with no reprocut code in
them (reprocut.check.verify). What they printed is the repro's own message: repro.py's header
and report.md quote it, with the original's beside it where the shrink changed it (smaller
shapes print smaller numbers). The result dict is what `--json` prints.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from reprocut.check.verify import Verification
from reprocut.model.case import Signature
from reprocut.model.recording import Failure, atomic_write
from reprocut.model.signature import last_exception
from reprocut.pipeline.cases import Outcome
from reprocut.report.markdown import ReportInputs
from reprocut.shrink.header import Environment, restate_message


def repro_message(verification: Verification, expected: Signature) -> str:
    """The message the repro's plain runs printed: that of the first run that failed as
    expected ("" when none did)."""
    for run in verification.outcomes:
        if run.signature is None or not run.signature.matches(expected, compare_op=False):
            continue
        found = last_exception(run.stderr_tail)
        if found is not None:
            return found[1]
    return ""


def with_repro_message(
    repro: Path, outcome: Outcome, failure: Failure, verification: Verification
) -> Outcome:
    """repro.py (on disk and in `outcome`) with its header quoting the repro's own message,
    the original's beside it where they differ."""
    message = repro_message(verification, failure.signature)
    if not message or not repro.is_file():
        return outcome
    code = repro.read_text()
    restated = restate_message(code, message, failure.error.message)
    if restated != code:
        atomic_write(repro, restated)
    return replace(outcome, code=restated)


def status(outcome: Outcome, verification: Verification) -> str:
    if not outcome.reproduced_from_capture:
        return "not-reproduced"
    if verification.reproduced == verification.runs:
        return "verified"
    return "flaky" if verification.reproduced else "not-verified"


def result_json(
    outcome: Outcome,
    signature: Signature,
    verification: Verification,
    repro: Path,
    report: Path,
    seconds: float,
) -> dict[str, Any]:
    return {
        "status": status(outcome, verification),
        "repro": str(repro),
        "report": str(report),
        "statements": outcome.statements,
        "tensor_elements": outcome.tensor_elements,
        "checks": outcome.checks,
        "slots": outcome.slots,  # candidates checked side by side
        "seconds": round(seconds, 3),
        "signature": {
            "error_type": signature.error_type,
            "error_code": signature.error_code,
            "op": signature.op,
            "kind": signature.kind,
        },
        "cpu_reproduces": outcome.cpu_reproduces,
        "cpu_message": outcome.cpu_message,
        "verified": {"runs": verification.runs, "reproduced": verification.reproduced},
        **({"passes": dict(outcome.passes)} if outcome.passes else {}),
    }


def report_inputs(
    outcome: Outcome,
    failure: Failure,
    environment: Environment,
    verification: Verification,
    seconds: float,
) -> ReportInputs:
    return ReportInputs(
        code=outcome.code,
        failure=failure,
        environment=environment,
        statements=outcome.statements,
        tensor_elements=outcome.tensor_elements,
        checks=outcome.checks,
        seconds=seconds,
        verified_runs=verification.runs,
        verified_reproduced=verification.reproduced,
        cpu_reproduces=outcome.cpu_reproduces,
        cpu_message=outcome.cpu_message,
        reproduced_from_capture=outcome.reproduced_from_capture,
        sidecar=outcome.sidecar,
        repro_message=repro_message(verification, failure.signature),
    )
