"""What `reprocut runs` shows: the recordings as a table, what a clean-up deleted, and which
recording `shrink` took when none was named."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console

from reprocut.model.runs import RunSummary
from reprocut.report.display.console import print_line
from reprocut.report.display.tables import FittedTable


def _when(started: str) -> str:
    """ "2026-12-01 09:37" from "2026-12-01T09:37:47+0000"."""
    return started[:16].replace("T", " ") if started else "?"


def _script(path: str) -> str:
    """The script relative to the working directory when it lies below it, else its name (the
    JSON output has the full path)."""
    if not path:
        return "?"
    script = Path(path)
    try:
        return str(script.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return script.name


def _op(summary: RunSummary) -> str:
    where = f" (step {summary.step})" if summary.step is not None else ""
    if summary.op:
        return summary.op + where
    return (summary.error or "") + where


def runs_table(runs: Sequence[RunSummary], picked: RunSummary | None) -> FittedTable:
    rows = [
        (
            summary.run.id + (" *" if summary is picked else ""),
            _when(summary.started),
            _script(summary.script),
            summary.status,
            _op(summary),
        )
        for summary in runs
    ]
    return FittedTable(
        ("run", "when", "script", "status", "op / error"), rows, box=box.SIMPLE, show_edge=False
    )


def print_runs(
    console: Console, root: Path, runs: Sequence[RunSummary], picked: RunSummary | None
) -> None:
    if not runs:
        print_line(console, f"no recordings under {root}/")
        return
    print_line(console, f"{len(runs)} recording(s) under {root}/")
    console.print(runs_table(runs, picked))
    if picked is not None:
        print_line(console, "* the one `reprocut shrink` takes: the latest with a failure")


def print_cleaned(
    console: Console, root: Path, deleted: Sequence[RunSummary], kept: Sequence[RunSummary]
) -> None:
    print_line(
        console,
        f"deleted {len(deleted)} recording(s) under {root}/, kept the {len(kept)} newest",
    )


def print_picked(console: Console, picked: RunSummary, passed_over: Sequence[RunSummary]) -> None:
    """`shrink` with no run directory: say which recording it took, and why not a newer one."""
    text = (
        f"[bold]·[/] shrinking {picked.run.id} ({_script(picked.script)}, "
        f"{_when(picked.started)}): the latest recording with a failure"
    )
    if passed_over:
        statuses = sorted({summary.status for summary in passed_over})
        text += f"; {len(passed_over)} newer without one ({', '.join(statuses)})"
    print_line(console, text)
