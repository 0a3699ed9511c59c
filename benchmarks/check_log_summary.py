"""Where a shrink's checks went, pass by pass, from its check log (REPROCUT_CHECK_LOG).

    python benchmarks/check_log_summary.py LOG.jsonl [LOG.jsonl ...]

A check line carries no pass name: it belongs to the pass that was running (in its process)
when the check started (its stamp less its seconds). Checks before the first pass or after the
reduction ended (the first check, the cpu check, confirmations) show as OUTSIDE. Per pass: checks
run, bets cancelled after they had started (their child seconds spent for nothing), candidates
not run because their code up to where a checked one raised was that one's (`known`), candidates
accepted, wall seconds of the pass, child seconds (in the processes that ran them) and the
verdicts; below the table, the other failures the checks saw most often. The reduction ends at its `done` event or when its phase (shrink, source_reduce) ends. Above the table,
how much of the reduction had no check in flight: the time its own thread spent making and
judging candidates (or waiting on a plain run) with every slot idle.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTSIDE = "OUTSIDE"
TOP = 6  # the other failures listed under each table
REDUCTION_PHASES = ("shrink", "source_reduce")


@dataclass(slots=True)
class PassRow:
    """One pass's share of the checks (a pass that runs in several rounds adds up)."""

    name: str
    runs: int = 0
    cancelled: int = 0
    known: int = 0
    accepted: int = 0
    wall: float = 0.0
    child: float = 0.0
    verdicts: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Summary:
    passes: dict[str, PassRow]
    phases: dict[str, float]
    failures: Counter[str] = field(default_factory=Counter)  # "pass: what it raised" -> checks
    reduction: float = 0.0  # seconds from the first pass to the reduction's end
    idle: float = 0.0  # of them, with no check in flight
    # the command's start to its first phase, and its last phase's end to its exit (None: the
    # log has no command events, from before they were logged)
    outside: tuple[float, float] | None = None

    def total(self) -> PassRow:
        whole = PassRow("total")
        for row in self.passes.values():
            whole.runs += row.runs
            whole.cancelled += row.cancelled
            whole.known += row.known
            whole.accepted += row.accepted
            whole.wall += row.wall
            whole.child += row.child
            whole.verdicts.update(row.verdicts)
        return whole


def read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a killed process
            continue
    return sorted(events, key=lambda event: event.get("t", 0.0))


def _spans(events: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(start, end, pass name) of each pass, in the order they ran."""
    marks: list[tuple[float, str | None]] = []
    for event in events:
        kind = event["kind"]
        if kind == "pass":
            marks.append((event["t"], str(event.get("pass_name") or "?")))
        elif kind == "done" or (kind == "phase" and event.get("phase") in REDUCTION_PHASES
                                 and "seconds" in event):  # fmt: skip
            marks.append((event["t"], None))
    spans = []
    ends = [*(at for at, _ in marks[1:]), float("inf")][: len(marks)]  # none without marks
    for (start, name), end in zip(marks, ends, strict=True):
        if name is not None:
            spans.append((start, end, name))
    return spans


def summarize(events: list[dict[str, Any]]) -> Summary:
    spans = _spans(events)
    passes: dict[str, PassRow] = {}
    for start, end, name in spans:
        row = passes.setdefault(name, PassRow(name))
        finite_end = end if end != float("inf") else max(e["t"] for e in events)
        row.wall += finite_end - start

    def owner(at: float) -> PassRow:
        for start, end, name in spans:
            if start <= at < end:
                return passes[name]
        return passes.setdefault(OUTSIDE, PassRow(OUTSIDE))

    failures: Counter[str] = Counter()
    for event in events:
        if event["kind"] == "accepted":
            owner(event["t"]).accepted += 1
        if event["kind"] == "known_failure":
            owner(event["t"]).known += 1
        if event["kind"] != "check":
            continue
        row = owner(event["t"] - float(event.get("seconds") or 0.0))
        child = event.get("child_seconds")
        verdict = str(event.get("verdict"))
        if verdict == "Cancelled":
            if child is None:
                continue  # cancelled before it ran: it cost nothing
            row.cancelled += 1
        row.runs += 1
        row.child += float(child or 0.0)
        row.verdicts[verdict] += 1
        if event.get("failed"):
            failures[f"{row.name}: {event['failed']}"] += 1
    phases = {
        str(event["phase"]): float(event["seconds"])
        for event in events
        if event["kind"] == "phase" and "seconds" in event
    }
    reduction, idle = idle_seconds(events, spans)
    return Summary(passes, phases, failures, reduction, idle, outside_phases(events))


def outside_phases(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(seconds from the command's start to its first phase, from its last phase's end to its
    exit): what a benchmark's wall time holds beyond the phases' own."""
    started = [e["t"] for e in events if e["kind"] == "command" and e.get("at") == "start"]
    exited = [e["t"] for e in events if e["kind"] == "command" and e.get("at") == "exit"]
    phased = [e["t"] for e in events if e["kind"] == "phase"]
    if not (started and exited and phased):
        return None
    return min(phased) - min(started), max(exited) - max(phased)


def idle_seconds(
    events: list[dict[str, Any]], spans: list[tuple[float, float, str]]
) -> tuple[float, float]:
    """(the reduction's seconds, those of them with no check in flight): from the first pass
    to the end of the last, less the union of every check's span (its stamp less its seconds)."""
    if not spans:
        return 0.0, 0.0
    start = spans[0][0]
    end = spans[-1][1] if spans[-1][1] != float("inf") else max(e["t"] for e in events)
    checks = sorted(
        (e["t"] - float(e.get("seconds") or 0.0), e["t"]) for e in events if e["kind"] == "check"
    )
    idle, reached = 0.0, start
    for begun, ended in checks:
        if begun > reached:
            idle += min(begun, end) - reached
        reached = max(reached, ended)
        if reached >= end:
            break
    idle += max(0.0, end - reached)
    return end - start, idle


def _verdicts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counter.most_common())


def markdown(title: str, summary: Summary) -> str:
    lines = [
        f"### {title}",
        "",
        "phases: " + ", ".join(f"{name} {sec:.1f} s" for name, sec in summary.phases.items()),
        "",
    ]
    if summary.outside is not None:
        lines += [
            f"outside them: {summary.outside[0]:.1f} s from the command's start to its first "
            f"phase, {summary.outside[1]:.1f} s from its last phase to its exit",
            "",
        ]
    lines += [
        f"no check in flight for {summary.idle:.1f} s of the reduction's {summary.reduction:.1f} s",
        "",
        "| pass | runs | cancelled once started | known | accepted | wall s | child s | verdicts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in [*summary.passes.values(), summary.total()]:
        lines.append(
            f"| {row.name} | {row.runs} | {row.cancelled} | {row.known} | {row.accepted} | "
            f"{row.wall:.1f} | {row.child:.1f} | {_verdicts(row.verdicts)} |"
        )
    if summary.failures:
        lines += ["", "other failures, most often first:", ""]
        lines += [f"- {count} × {what}" for what, count in summary.failures.most_common(TOP)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="check logs (JSON lines)")
    args = parser.parse_args(argv)
    for path in args.logs:
        if not path.is_file():
            print(f"error: no such check log: {path}", file=sys.stderr)
            return 2
        name = path.name.split(".")[0]
        sys.stdout.write(markdown(name, summarize(read_events(path))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
