"""Grade one reprocut run on one corpus case against the case's ground truth.

Input is what the tool printed (`record --json`, `shrink --json`) plus exit codes and times;
output is a CaseScore of named checks. Pure functions: no subprocess, no torch, so the rules
are unit-tested on canned JSON. A check is True (right), False (wrong) or None (not scored
for this case, e.g. the step of a flaky case or the repro of a case that must pass).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import PurePath
from typing import Any

from benchmarks.corpus_audit import AuditResult
from benchmarks.corpus_cases import CorpusCase

# `reprocut record` exit codes (reprocut.model.errors.ExitCode), repeated here so scoring stays pure.
RECORD_LOCALIZED = 0
RECORD_NOTHING_TO_REPRODUCE = 1
PASS_STATUSES = frozenset({"passed", "pass", "no-failure", "nothing-to-reproduce", "ok"})

# The checks that decide whether a case counts as passing, in table order.
CHECKS = ("outcome", "op", "line", "step", "signature", "facts", "verified", "audit")


@dataclass(frozen=True, slots=True)
class RunOutput:
    """One subprocess: exit code, parsed JSON (None if none was printed), wall seconds."""

    returncode: int | None  # None: killed after the timeout
    data: dict[str, Any] | None
    seconds: float
    stderr_tail: str = ""

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


@dataclass(frozen=True, slots=True)
class CaseScore:
    case: str
    device: str
    expect: str
    outcome: bool | None = None  # failed when it must, passed when it must
    op: bool | None = None
    line: bool | None = None
    step: bool | None = None
    signature: bool | None = None
    facts: bool | None = None
    verified: bool | None = None  # shrink produced a repro that reproduces the signature
    audit: bool | None = None  # the facts audit (corpus_audit): no false fact, none missing
    module: bool | None = None  # informational, not part of `passed`
    phase: bool | None = None  # informational
    statements: int | None = None
    tensor_elements: int | None = None
    checks: int | None = None
    record_seconds: float | None = None
    shrink_seconds: float | None = None
    notes: tuple[str, ...] = ()
    got: dict[str, Any] = field(default_factory=dict)
    facts_checked: int | None = None  # the audit's (rule, output) pairs
    false_facts: tuple[str, ...] = ()  # must_not rules that matched
    missing_facts: tuple[str, ...] = ()  # must rules that did not

    @property
    def passed(self) -> bool:
        """Every scored check right (unscored ones do not count against the case)."""
        return all(getattr(self, name) is not False for name in CHECKS) and self.outcome is True

    def passing_checks(self) -> list[str]:
        return [name for name in CHECKS if getattr(self, name) is True]

    def baseline_checks(self) -> list[str]:
        """The checks a later run must keep: for a flaky case only that record coped."""
        checks = self.passing_checks()
        return [c for c in checks if c == "outcome"] if self.expect == "flaky" else checks

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        data["passed"] = self.passed
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseScore:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("notes", "false_facts", "missing_facts"):
            values[name] = tuple(values.get(name, ()))
        return cls(**values)


def base_op(name: str | None) -> str | None:
    """`aten::embedding.default` -> `aten::embedding`; public dotted names are kept."""
    if not name:
        return None
    if name.startswith("aten::") or name.startswith("aten."):
        stem = name.replace("aten.", "aten::", 1) if name.startswith("aten.") else name
        head, _, rest = stem.partition("::")
        return f"{head}::{rest.split('.')[0]}"
    return name


def record_failed(run: RunOutput) -> bool | None:
    """Did record see a failure? None when it crashed, timed out or printed nothing usable."""
    if run.timed_out:
        return None
    status = str((run.data or {}).get("status", "")).lower()
    under_pytest = bool((run.data or {}).get("test"))  # exit code: pytest's own
    nothing = run.returncode == RECORD_NOTHING_TO_REPRODUCE and not under_pytest
    if nothing or status in PASS_STATUSES or status == "no-failing-test":
        return False
    if run.data is None:
        return None
    return True


def _op_right(case: CorpusCase, device: str, data: dict[str, Any]) -> bool:
    got_op, got_call = base_op(data.get("op")), data.get("public_call")
    if case.kernel:
        haystack = " ".join(str(data.get(k) or "") for k in ("op", "public_call", "kernel"))
        return case.kernel in haystack
    want = base_op(case.expected_op(device))
    if want is None:
        return got_op is None
    if want.startswith("aten::"):
        return got_op == want
    return want in (got_op, got_call)  # a public call: either field may name it


def _line_right(case: CorpusCase, data: dict[str, Any]) -> bool:
    culprit = case.culprit()
    source = data.get("source") or {}
    if culprit is None or not source.get("file"):
        return False
    want_file, want_line = culprit
    got = PurePath(str(source["file"])).as_posix()
    if case.cell is not None and source.get("cell") != case.cell:  # a notebook's cell
        return False
    return got.endswith(f"{case.name}/{want_file}") and source.get("line") == want_line


def _step_right(case: CorpusCase, data: dict[str, Any]) -> bool | None:
    """The optimizer step; a pytest case has none: its failing test and the test's line."""
    if case.test is not None:
        test = data.get("test") or {}
        line_right = case.test_line is None or test.get("line") == case.test_line
        return test.get("nodeid") == case.test and line_right
    if case.step is None:
        return None
    # case.toml's step counts the optimizer steps done before the failure: after the training
    # loop had ended, record names no step but says how many ran
    done = data.get("step")
    if done is None:
        done = (data.get("after_loop") or {}).get("steps")
    return done == case.step


def _signature_right(case: CorpusCase, device: str, data: dict[str, Any]) -> bool:
    truth = case.truth(device)
    got = data.get("signature") or {}
    if truth.kind is not None and got.get("kind") != truth.kind:
        return False
    if truth.error_type is not None and got.get("error_type") != truth.error_type:
        return False
    return truth.error_code is None or got.get("error_code") == truth.error_code


def _kind(data: dict[str, Any]) -> str | None:
    return (data.get("signature") or {}).get("kind")


def _facts_right(case: CorpusCase, data: dict[str, Any]) -> bool:
    text = " ".join(str(f) for f in data.get("facts") or ())
    return all(fact in text for fact in case.facts)


def score_case(
    case: CorpusCase,
    device: str,
    record: RunOutput,
    shrink: RunOutput | None = None,
) -> CaseScore:
    """Grade one record (+ optional shrink) run of `case` on `device`."""
    data = record.data or {}
    failed = record_failed(record)
    notes: list[str] = []
    if record.timed_out:
        notes.append("record timed out")
    elif failed is None:
        notes.append(f"record exit {record.returncode}, no JSON")
    must_fail = case.expects_failure(device)
    scored = dict(
        case=case.name,
        device=device,
        expect=case.expect,
        record_seconds=round(record.seconds, 2),
        got={
            k: data.get(k)
            for k in ("status", "op", "public_call", "step", "phase", "module", "facts")
        }
        | {"source": (data.get("source") or {}).get("line"), "kind": _kind(data)},
    )
    if case.expect == "flaky":
        # Either outcome is fine; when it failed, it must name the right op and line.
        outcome = failed is not None
        if failed:
            scored.update(op=_op_right(case, device, data), line=_line_right(case, data))
        return CaseScore(outcome=outcome, notes=tuple(notes), **scored)
    if not must_fail:
        if failed:
            notes.append(f"reported a failure in a run that must pass: {data.get('op')}")
        return CaseScore(outcome=failed is False, notes=tuple(notes), **scored)
    if failed is not True:
        if failed is False:
            notes.append("record saw no failure")
        return CaseScore(outcome=False, notes=tuple(notes), **scored)
    truth = case.truth(device)
    if not truth.verified:
        notes.append(f"{device} ground truth not yet confirmed on that device")
    score = CaseScore(
        outcome=True,
        op=_op_right(case, device, data),
        line=_line_right(case, data),
        step=_step_right(case, data),
        signature=_signature_right(case, device, data),
        facts=_facts_right(case, data) if case.facts else None,
        module=None if case.module is None else data.get("module") == case.module,
        phase=None if case.phase is None else data.get("phase") == case.phase,
        notes=tuple(notes),
        **scored,
    )
    return _with_shrink(score, shrink)


def with_audit(score: CaseScore, result: AuditResult | None) -> CaseScore:
    """`score` with the facts audit of the case's outputs (None: nothing was printed to read)."""
    if result is None or not result.checked:
        return score
    return replace(
        score,
        audit=result.right,
        facts_checked=result.checked,
        false_facts=result.false,
        missing_facts=result.missing,
    )


def _runs_all_reproduced(verified: Any) -> bool:
    """shrink reports `verified` as {"runs": n, "reproduced": k} (or a bool)."""
    if isinstance(verified, dict):
        runs = verified.get("runs")
        return bool(runs) and verified.get("reproduced") == runs
    return verified is not False


def _with_shrink(score: CaseScore, shrink: RunOutput | None) -> CaseScore:
    if shrink is None:
        return score
    data = shrink.data or {}
    status = str(data.get("status", "")).lower()
    verified = (
        not shrink.timed_out
        and shrink.returncode == 0
        and status not in {"not-reproduced", "flaky", "failed", "error", "unverified"}
        and _runs_all_reproduced(data.get("verified", True))
    )
    notes = list(score.notes)
    if shrink.timed_out:
        notes.append("shrink timed out")
    elif not verified:
        notes.append(f"shrink exit {shrink.returncode} status {status or '?'}")
    return replace(
        score,
        verified=verified,
        statements=data.get("statements"),
        tensor_elements=data.get("tensor_elements"),
        checks=data.get("checks"),
        shrink_seconds=round(shrink.seconds, 2),
        notes=tuple(notes),
    )


@dataclass(frozen=True, slots=True)
class Totals:
    cases: int
    passed: int
    right: dict[str, tuple[int, int]]  # check -> (right, scored)
    record_seconds: float
    shrink_seconds: float
    median_statements: float | None
    median_tensor_elements: float | None
    facts_checked: int = 0  # the facts audit, over every case
    false_facts: int = 0
    missing_facts: int = 0


def totals(scores: list[CaseScore]) -> Totals:
    right = {}
    for name in (*CHECKS, "module", "phase"):
        values = [getattr(s, name) for s in scores if getattr(s, name) is not None]
        right[name] = (sum(1 for v in values if v), len(values))
    statements = [s.statements for s in scores if s.statements is not None]
    elements = [s.tensor_elements for s in scores if s.tensor_elements is not None]
    return Totals(
        cases=len(scores),
        passed=sum(1 for s in scores if s.passed),
        right=right,
        record_seconds=round(sum(s.record_seconds or 0 for s in scores), 1),
        shrink_seconds=round(sum(s.shrink_seconds or 0 for s in scores), 1),
        median_statements=statistics.median(statements) if statements else None,
        median_tensor_elements=statistics.median(elements) if elements else None,
        facts_checked=sum(s.facts_checked or 0 for s in scores),
        false_facts=sum(len(s.false_facts) for s in scores),
        missing_facts=sum(len(s.missing_facts) for s in scores),
    )


def regressions(baseline: dict[str, list[str]], scores: list[CaseScore]) -> list[str]:
    """Checks that passed in the baseline (case -> passing check names) and no longer do."""
    by_case = {s.case: s for s in scores}
    lost = []
    for case, checks in sorted(baseline.items()):
        score = by_case.get(case)
        if score is None:
            continue  # not run this time (filtered out or not applicable)
        now = set(score.passing_checks())
        lost.extend(f"{case}: {check}" for check in checks if check not in now)
    return lost
