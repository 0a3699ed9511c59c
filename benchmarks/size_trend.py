"""Size beside time: a faster shrink that writes a larger repro is a regression, not a gain.

Every shrink benchmark reports each repro's size (statements or lines) beside its seconds, and
keeps both in its JSON result. `trend_lines` compares a run with the previous result of the
same benchmark (its JSON as committed, read before the run overwrites it) and writes, for the
results markdown, the rows whose repro grew (a regression, however much faster) or shrank, with
their seconds then and now; a row without an earlier figure is left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Sized:
    """One result row: which (case and config), the repro's size, and the seconds it took."""

    key: str
    size: int | None
    seconds: float | None


def read_previous(path: Path) -> Any:
    """The previous result's JSON at `path` (None: none yet, or unreadable): read it before the
    run overwrites it. Each benchmark turns its own rows into `Sized` (older files included)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def size_changes(previous: Iterable[Sized], current: Iterable[Sized]) -> list[tuple[Sized, Sized]]:
    """(before, now) for each row whose size changed, in the current run's order."""
    before = {row.key: row for row in previous if row.size is not None}
    return [
        (before[row.key], row)
        for row in current
        if row.size is not None and row.key in before and before[row.key].size != row.size
    ]


def regressions(previous: Iterable[Sized], current: Iterable[Sized]) -> list[str]:
    """The keys of the rows whose repro grew."""
    return [now.key for then, now in size_changes(previous, current) if now.size > then.size]  # type: ignore[operator]


def trend_lines(previous: Iterable[Sized], current: Iterable[Sized], *, unit: str,
                since: str = "") -> list[str]:  # fmt: skip
    """Markdown: the size changes against the previous result (`unit`: "statements", "lines")."""
    previous, current = list(previous), list(current)
    head = ["", "## Repro size against the previous result", ""]
    if not previous:
        return [*head, "No earlier result with sizes to compare with."]
    changes = size_changes(previous, current)
    when = f" ({since})" if since else ""
    if not changes:
        return [*head, f"Every repro the same size as in the previous result{when}."]
    grew = regressions(previous, current)
    lines = [
        *head,
        f"Against the previous result{when}: {len(grew)} repro(s) larger (a regression, whatever "
        f"the seconds), {len(changes) - len(grew)} smaller.",
        "",
        f"| row | {unit} then | {unit} now | seconds then | seconds now | |",
        "|---|---|---|---|---|---|",
    ]
    for then, now in changes:
        mark = "**larger**" if now.key in grew else "smaller"
        lines.append(f"| {now.key} | {then.size} | {now.size} | {_s(then.seconds)} | "
                     f"{_s(now.seconds)} | {mark} |")  # fmt: skip
    return lines


def _s(value: float | None) -> str:
    return "·" if value is None else f"{value:.1f}"
