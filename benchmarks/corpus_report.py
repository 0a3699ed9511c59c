"""Render corpus scores as the committed markdown table and its JSON twin."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.corpus_score import CHECKS, CaseScore, Totals, totals

MARKS = {True: "✓", False: "✗", None: "·"}
COLUMNS = (
    "case",
    "expect",
    "outcome",
    "op",
    "line",
    "step",
    "signature",
    "facts",
    "verified",
    "audit",
    "module",
    "statements",
    "tensor elements",
    "checks",
    "record s",
    "shrink s",
    "notes",
)


def _cell(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return MARKS[value]
    return str(value)


def _audit_cell(score: CaseScore) -> str:
    """✓ and the facts checked; ✗ with how many were false or missing."""
    if score.audit is None:
        return MARKS[None]
    wrong = len(score.false_facts) + len(score.missing_facts)
    return f"✓ {score.facts_checked}" if score.audit else f"✗ {wrong}/{score.facts_checked}"


def audit_lines(scores: list[CaseScore], summary: Totals) -> list[str]:
    """The facts audit's totals, and each false or missing fact with its case."""
    lines = [
        f"Facts audit (case.toml `[audit]`): {summary.facts_checked} facts checked, "
        f"false facts found: {summary.false_facts}, missing facts: {summary.missing_facts}."
    ]
    for score in scores:
        lines += [f"- {score.case}: {fact}" for fact in (*score.false_facts, *score.missing_facts)]
    return lines


def _row(score: CaseScore) -> list[str]:
    return [
        score.case + (" **pass**" if score.passed else ""),
        score.expect,
        *(_cell(getattr(score, name)) for name in ("outcome", "op", "line", "step")),
        *(_cell(getattr(score, name)) for name in ("signature", "facts", "verified")),
        _audit_cell(score),
        _cell(score.module),
        _cell(score.statements),
        _cell(score.tensor_elements),
        _cell(score.checks),
        _cell(score.record_seconds),
        _cell(score.shrink_seconds),
        "; ".join(score.notes).replace("|", "/"),
    ]


def _totals_lines(summary: Totals) -> list[str]:
    parts = [f"{name} {r}/{n}" for name, (r, n) in summary.right.items() if n]
    lines = [
        f"**{summary.passed}/{summary.cases} cases pass** (every scored check right).",
        "",
        "Right / scored: " + ", ".join(parts) + ".",
        "",
        f"Record time {summary.record_seconds} s in total, shrink time {summary.shrink_seconds} s.",
    ]
    if summary.median_statements is not None:
        lines.append(
            f"Median repro: {summary.median_statements} statements, "
            f"{summary.median_tensor_elements} tensor elements."
        )
    return lines


def render_markdown(scores: list[CaseScore], meta: dict[str, Any]) -> str:
    header = [
        f"# reprocut corpus results: {meta['device']} ({meta['date']})",
        "",
        f"- device: {meta['device_name']}",
        f"- torch {meta['torch']}, Python {meta['python']}, {meta['platform']}",
        f"- command: `{meta['command']}`",
        f"- commit: {meta.get('commit', '?')}, wall time {meta.get('wall_seconds', '?')} s",
        *([f"- **incomplete run: {meta['incomplete']}**"] if meta.get("incomplete") else []),
        "",
        "✓ right, ✗ wrong, · not scored for this case. A case passes when every scored check "
        f"({', '.join(CHECKS)}) is right; `module` is informational. Cases the tool gets wrong "
        "stay in the table.",
        "",
    ]
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(_row(s)) + " |" for s in scores]
    summary = totals(scores)
    return "\n".join(
        [*header, *table, "", "## Totals", "", *_totals_lines(summary), "",
         *audit_lines(scores, summary), ""]
    )  # fmt: skip


def write_results(
    scores: list[CaseScore], meta: dict[str, Any], out_dir: Path
) -> tuple[Path, Path]:
    """Write corpus-<device>.md and .json (corpus-<device>-<tag>.* for a tagged partial run),
    overwriting the last run's: the date is inside. Returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"-{meta['tag']}" if meta.get("tag") else ""
    stem = out_dir / f"corpus-{meta['device']}{tag}"
    markdown, twin = stem.with_suffix(".md"), stem.with_suffix(".json")
    markdown.write_text(render_markdown(scores, meta))
    payload = {
        "meta": meta,
        "totals": asdict(totals(scores)),
        "cases": [s.to_json() for s in scores],
    }
    twin.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return markdown, twin
