"""bench_faults.py's rows and its result files (faults-<device>.md and .json).

Per case: localized right, the repro verified by a plain `python repro.py`, the same bug (the
repro's memcheck fingerprint equal to the original's, as shrink judged it), the original's
fingerprint against case.toml's, and the time; then medians and the settings shrink ran with.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.corpus_report import audit_lines
from benchmarks.corpus_score import CaseScore, totals
from benchmarks.size_trend import Sized, read_previous, trend_lines
from reprocut.model.fingerprint import location_class

LOCALIZED = ("outcome", "op", "line", "step", "signature")
MARK = {True: "✓", False: "✗", None: "·"}


@dataclass(frozen=True)
class Reduced:
    """One reducer's result on one case."""

    seconds: float | None = None
    reduce_seconds: float | None = None  # reprocut: the reduction alone (its `phases`)
    checks: int | None = None
    lines: int | None = None
    code_lines: int | None = None  # without the module docstring (reprocut's header)
    verified: bool | None = None  # a plain `python repro.py` failed with the case's signature
    status: str = ""
    runs: str = ""  # reprocut: its own plain verification runs, "3/3"
    sanitizer: dict[str, Any] = field(default_factory=dict)
    same_bug: dict[str, Any] = field(default_factory=dict)  # shrink's `same_bug`
    stopped: str = ""  # what ended the reduction ("fixed point", "max time", ...)
    limits: dict[str, Any] = field(default_factory=dict)  # the limits shrink ran with
    plain_note: str = ""  # the harness's own plain run, when it did not fail as expected


@dataclass(frozen=True)
class FaultRow:
    case: str
    family: str
    score: CaseScore
    reprocut: Reduced = field(default_factory=Reduced)
    generic: Reduced = field(default_factory=Reduced)
    truth: bool | None = None  # the original's fingerprint is case.toml's [expected.fingerprint]

    @property
    def localized(self) -> bool:
        return all(getattr(self.score, name) is True for name in LOCALIZED)

    @property
    def same_bug(self) -> bool | None:
        return self.reprocut.same_bug.get("equal")

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "family": self.family,
            "localized": self.localized,
            "same_bug": self.same_bug,
            "truth_fingerprint": self.truth,
            "score": self.score.to_json(),
            "reprocut": asdict(self.reprocut),
            "generic": asdict(self.generic),
        }


def matches_truth(expected: dict[str, Any], original: dict[str, Any] | None) -> bool | None:
    """Is the original's memcheck fingerprint the one case.toml expects (kernel, the relation's
    class as shrink compares it, an access kind among those printed; case.toml may list more
    than one kind where the bug makes both)? None: nothing to compare."""
    if not expected or not original:
        return None
    kinds = set(original.get("accesses") or [original.get("access")])
    allowed = expected.get("access")
    allowed = set(allowed) if isinstance(allowed, list) else {allowed}
    return (
        original.get("kernel") == expected.get("kernel")
        and location_class(original.get("relation")) == location_class(expected.get("relation"))
        and bool(kinds & allowed)
    )


def sanitizer_cell(row: FaultRow) -> str:
    evidence = row.reprocut.sanitizer
    if not evidence:
        memory = (row.score.got.get("kind") or "").lower()
        if "illegal memory" in memory or "misaligned" in memory:
            return "✗ none attached"
        return "· (not a memory error)"
    if evidence.get("status") == "found":
        findings = evidence.get("findings") or []
        return "✓ " + "; ".join(findings[:2]).replace("|", "/")
    return f"{evidence.get('status')}: {evidence.get('note', '')}".replace("|", "/")


def same_bug_cell(row: FaultRow) -> str:
    same = row.reprocut.same_bug
    if not same:
        return MARK[None]
    if same.get("equal") is None:
        return "· " + "; ".join(same.get("skipped") or ["not checked"]).replace("|", "/")
    mark = MARK[bool(same["equal"])]
    differ = f" ({', '.join(same.get('differ') or [])})" if same.get("differ") else ""
    note = " walked back" if "walked back" in (same.get("note") or "") else ""
    return f"{mark}{differ}{note}"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 1) if present else None


def _seconds(value: float | None) -> str:
    return "·" if value is None else f"{value} s"


def _cell(value: Any) -> str:
    return MARK[None] if value is None else str(value)


def settings_line(meta: dict[str, Any], rows: list[FaultRow]) -> str:
    """What shrink ran with: its defaults unless the command gave limits."""
    limits = sorted(
        {json.dumps(r.reprocut.limits, sort_keys=True) for r in rows if r.reprocut.limits}
    )
    seen = "; ".join(limits) or "?"
    if meta.get("max_time") is None:
        return (f"- `reprocut shrink` at its default settings (no --max-time, --timeout, --runs); "
                f"limits it reported: {seen}")  # fmt: skip
    return f"- `reprocut shrink --max-time {meta['max_time']:.0f}`; limits it reported: {seen}"


def render(rows: list[FaultRow], meta: dict[str, Any]) -> str:
    r_median = _median([r.reprocut.seconds for r in rows])
    good = [r for r in rows if r.reprocut.verified and r.same_bug]
    lines = [
        f"# Fault classes on {meta.get('device_name', '?')}: record + shrink, the same bug?",
        "",
        f"- {meta['date']}, torch {meta.get('torch', '?')}, Python {meta.get('python', '?')}, "
        f"commit {meta.get('commit', '?')}, wall time {meta.get('wall_seconds', '?')} s"
        + (f" ({meta['incomplete']})" if meta.get("incomplete") else ""),
        f"- command: `{meta['command']}`",
        settings_line(meta, rows),
        f"- recordings {meta.get('record_jobs', meta.get('jobs', '?'))} at once, all before the "
        f"shrinks; shrinks {meta.get('jobs', '?')} at once (1: each alone on the machine); "
        f"{meta.get('check_timeout', '?')} s per plain "
        f"check of the harness; generic reducer: {meta.get('generic_version', '(not run)')}",
        f"- each case's repro.py, report.md, compute-sanitizer logs and shrink JSON: "
        f"`{repros_folder(Path('.'), meta['device']).name}/`",
        "",
        "`localized`: outcome, op (kernel), line, step and signature all right (case.toml). "
        "`verified`: the repro, run once more as a plain `python repro.py` (no "
        "CUDA_LAUNCH_BLOCKING) from where it was written, failed with case.toml's signature; "
        "in brackets shrink's own plain runs. `same bug`: shrink's verdict, the repro's memcheck "
        "fingerprint (kernel, access, where the address falls) against the original's. `truth`: "
        "the original's fingerprint is case.toml's `[expected.fingerprint]`. `shrink s`: wall "
        "time of `reprocut shrink` (everything: fork server, reduction, verification, memcheck "
        "of the original and the repro, report); `reduce s`: the reduction alone; `stopped`: "
        "what ended the reduction. `lines`: non-blank lines of repro.py (statements in "
        "brackets); `code`: the same less the header docstring.",
        "",
        "| case | localized | verified | same bug | truth | shrink s | reduce s | stopped | checks "
        "| lines | code | compute-sanitizer (repro) | generic verified | generic s | generic lines "
        "| notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        r, g = row.reprocut, row.generic
        runs = f" ({r.runs})" if r.runs else ""
        statuses = [s for s in (r.status, g.status) if s and s not in ("verified", "finished")]
        notes = "; ".join([*row.score.notes, *statuses])
        statements = f" ({row.score.statements})" if row.score.statements is not None else ""
        lines.append(
            f"| {row.case} | {MARK[row.localized]} | {MARK[r.verified]}{runs} | "
            f"{same_bug_cell(row)} | {MARK[row.truth]} | {_cell(r.seconds)} | "
            f"{_cell(r.reduce_seconds)} | {r.stopped or MARK[None]} | {_cell(r.checks)} | "
            f"{_cell(r.lines)}{statements} | {_cell(r.code_lines)} | {sanitizer_cell(row)} | "
            f"{MARK[g.verified]} | {_cell(g.seconds)} | {_cell(g.lines)} | "
            f"{notes.replace('|', '/')} |"
        )
    lines += [
        "",
        f"**Median shrink time {_seconds(r_median)} (reduction alone "
        f"{_seconds(_median([r.reprocut.reduce_seconds for r in rows]))}), median repro "
        f"{_cell(_median([r.reprocut.lines for r in rows]))} lines; verified and the "
        f"same bug: {len(good)}/{len(rows)}** (verified {sum(bool(r.reprocut.verified) for r in rows)}, "
        f"same bug {sum(r.same_bug is True for r in rows)}, fingerprint as case.toml "
        f"{sum(r.truth is True for r in rows)}; localized right {sum(r.localized for r in rows)}).",
    ]
    scores = [row.score for row in rows]
    lines += ["", *audit_lines(scores, totals(scores))]
    if any(r.generic.seconds is not None for r in rows):
        lines.append(
            f"Generic reducer: median {_seconds(_median([r.generic.seconds for r in rows]))}."
        )
    missed = [row for row in rows if row.reprocut.plain_note]
    if missed:
        lines += ["", "## the harness's plain run that did not fail as expected", ""]
        for row in missed:
            lines += [f"### {row.case}", "", "```", row.reprocut.plain_note.strip(), "```", ""]
    found = [row for row in rows if row.reprocut.sanitizer.get("findings")]
    if found:
        lines += ["", "## compute-sanitizer findings attached by shrink", ""]
        for row in found:
            lines += [f"### {row.case}", "", "```", *row.reprocut.sanitizer["findings"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def repros_folder(out: Path, device: str) -> Path:
    """Where each case's repro and shrink output are copied: beside the table, one name per device."""
    return out / f"faults-{device}-repros"


def write(
    rows: list[FaultRow], meta: dict[str, Any], out: Path, previous: dict[str, Any] | None = None
) -> Path:
    """faults-<device>.md and .json in `out`, overwriting the last run's (the date is inside);
    the markdown ends with the repro sizes against that last run's (size_trend.py). `previous`:
    that run's JSON, read before this run wrote anything (`previous_result`); by default the
    file as it is now."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"faults-{meta['device']}"
    cases = [row.to_json() for row in rows]
    if previous is None:
        previous = previous_result(out, meta["device"])
    since = str((previous.get("meta") or {}).get("date", ""))
    trend = trend_lines(sizes(previous.get("cases") or []), sizes(cases), unit="lines", since=since)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")
    markdown = out / f"{stem}.md"
    markdown.write_text(render(rows, meta) + "\n".join(trend) + "\n")
    return markdown


def previous_result(out: Path, device: str) -> dict[str, Any]:
    """The last run's JSON in `out` ({} if none). A benchmark that writes its partial results
    as each case ends reads it once, before its first write: else its final table compared
    itself with its own partial one ("every repro the same size as in the previous result",
    whatever the sizes had been before)."""
    return read_previous(out / f"faults-{device}.json") or {}


def sizes(cases: list[dict[str, Any]]) -> list[Sized]:
    """Each reducer's repro size (lines) beside its seconds, from the JSON's cases."""
    return [
        Sized(f"{case['case']} / {who}", (case.get(who) or {}).get("lines"),
              (case.get(who) or {}).get("seconds"))
        for case in cases for who in ("reprocut", "generic")
        if (case.get(who) or {}).get("lines")
    ]  # fmt: skip
