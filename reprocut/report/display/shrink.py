"""What `reprocut shrink` shows on stderr: on a terminal a live bar (the size cut so far, the
checks run, the pass, the best's size), and on any stream a plain line per accepted step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from reprocut.report.display.console import print_line

PHASE_LABELS = {
    "fork_server": "fork server start",
    "read": "reading the recording",
    "first_check": "first check",
    "shrink": "shrinking",
    "source_reduce": "reducing the script",
    "cpu_check": "CPU check",
    "verify": "verification",
    "report": "report",
}


def phase_label(name: str) -> str:
    return PHASE_LABELS.get(name, name.replace("_", " "))


def _describe(event: Any) -> tuple[str, int, str]:
    """(pass name, checks, size text) of a case-shrinker or source-reducer event."""
    name = getattr(event, "pass_name", "") or ""
    checks = int(getattr(event, "checks", 0) or 0)
    amount = _amount(event)
    if amount is None:
        size = ""
    else:
        size = f"{amount} {'tensor elements' if hasattr(event, 'size') else 'lines'}"
    return name, checks, size


def _amount(event: Any) -> int | None:
    """The best's size an event reports: tensor elements (the case shrinker), lines (the
    source reducer); None when it reports none."""
    for field in ("size", "lines"):
        value = getattr(event, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _checks(count: int) -> str:
    return f"{count} check" + ("" if count == 1 else "s")


class _AcceptedLines:
    """One line per pass and size: steps of a pass that leave the size as it was (each dropped
    keyword, say) are counted into the line, printed once the pass or the size moves on."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.pending: tuple[str, str] | None = None
        self.steps = 0
        self.checks = 0

    def add(self, name: str, size: str, checks: int) -> None:
        if self.pending != (name, size):
            self.flush()
        self.pending, self.checks = (name, size), checks
        self.steps += 1

    def flush(self) -> None:
        if self.pending is None:
            return
        name, size = self.pending
        steps = f"{self.steps} steps, " if self.steps > 1 else ""
        print_line(self.console, f"[green]✓[/] {name} → {size} ({steps}{_checks(self.checks)})")
        self.pending, self.steps = None, 0


class _Bar:
    """The live bar's share of the reduction done: the size cut so far, of the size the
    reduction started from (a new reduction, the script's after the captured call's, starts
    the bar again)."""

    def __init__(self) -> None:
        self.kind: type | None = None
        self.start = 0

    def update(self, event: Any, amount: int) -> tuple[int, int]:
        """(total, completed) for the bar."""
        if type(event).__module__ != getattr(self.kind, "__module__", None) or amount > self.start:
            self.kind, self.start = type(event), amount
        return self.start, self.start - amount


@contextmanager
def shrink_display(console: Console, *, enabled: bool = True) -> Iterator[Callable[[Any], None]]:
    """Yield an on_event callback. On a TTY, a rich bar of the size cut so far with the checks
    run, the pass and the best's size; accepted steps as plain lines on a TTY or not."""
    live = enabled and console.is_terminal
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        TextColumn("{task.fields[size]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not live,
    ) as progress:
        task = progress.add_task("shrinking", total=None, size="")
        lines = _AcceptedLines(progress.console)
        bar = _Bar()

        def on_event(event: Any) -> None:
            phase = getattr(event, "phase", None)
            if phase is not None:  # a pipeline phase started (seconds None) or ended
                lines.flush()  # the last accepted step before what the phase prints
                if getattr(event, "seconds", None) is None:
                    progress.update(task, description=f"{phase_label(phase)}…")
                return
            name, checks, size = _describe(event)
            # the case shrinker says "accepted"; the source reducer sends the accepted script
            accepted = getattr(event, "kind", None) == "accepted" or hasattr(event, "code")
            amount = _amount(event)
            if amount is not None:
                total, completed = bar.update(event, amount)
                progress.update(task, total=total, completed=completed)
            progress.update(task, description=f"{_checks(checks)} · {name}", size=size)
            if accepted and enabled:
                lines.add(name, size, checks)

        try:
            yield on_event
        finally:
            lines.flush()


def print_phase(console: Console, text: str) -> None:
    print_line(console, f"[bold]·[/] {text}")


def print_result(console: Console, result: dict[str, Any]) -> None:
    """The closing summary: where the repro is, how small, verified how often."""
    verified = result.get("verified") or {}
    size = f"{result.get('statements')} statements"
    if result.get("tensor_elements") is not None:
        size += f", {result['tensor_elements']} tensor elements"
    print_line(
        console,
        f"[bold green]repro[/]: {result.get('repro')} ({size}; "
        f"{_checks(result.get('checks') or 0)}, {result.get('seconds', 0):.1f} s)",
    )
    print_line(
        console,
        f"verified: {verified.get('reproduced', 0)}/{verified.get('runs', 0)} plain runs "
        f"failed with {result.get('signature_text', 'the signature')}",
    )
    if result.get("cpu_reproduces") is not None:
        print_line(console, f"CPU reproduces: {'yes' if result['cpu_reproduces'] else 'no'}")
    if result.get("report"):
        print_line(console, f"report: {result['report']}")
    if result.get("phases"):
        print_line(console, phases_line(result["phases"]))


def phases_line(phases: dict[str, float]) -> str:
    """Where the time went, phase by phase (some ran side by side)."""
    parts = [f"{phase_label(name)} {seconds:.1f} s" for name, seconds in phases.items()]
    return "[dim]time: " + " · ".join(parts) + "[/]"
