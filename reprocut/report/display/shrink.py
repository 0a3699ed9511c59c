"""What `reprocut shrink` shows on stderr: live progress on a terminal, plain lines otherwise."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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
    if hasattr(event, "size"):
        size = f"{event.size} tensor elements"
    elif hasattr(event, "lines"):
        size = f"{event.lines} lines"
    else:
        size = ""
    return name, checks, size


@contextmanager
def shrink_display(console: Console, *, enabled: bool = True) -> Iterator[Callable[[Any], None]]:
    """Yield an on_event callback. A rich progress line on a TTY; accepted steps as plain lines."""
    live = enabled and console.is_terminal
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not live,
    ) as progress:
        task = progress.add_task("shrinking")

        def on_event(event: Any) -> None:
            phase = getattr(event, "phase", None)
            if phase is not None:  # a pipeline phase started (seconds None) or ended
                if getattr(event, "seconds", None) is None:
                    progress.update(task, description=f"{phase_label(phase)}…")
                return
            name, checks, size = _describe(event)
            kind = getattr(event, "kind", None)
            accepted = kind == "accepted" or getattr(event, "accepted", False) is True
            progress.update(task, description=f"{checks} checks · {name} · best: {size}")
            if accepted and enabled:
                progress.console.print(f"[green]✓[/] {name} → {size} ({checks} checks)")

        yield on_event


def print_phase(console: Console, text: str) -> None:
    console.print(f"[bold]·[/] {text}")


def print_result(console: Console, result: dict[str, Any]) -> None:
    """The closing summary: where the repro is, how small, verified how often."""
    verified = result.get("verified") or {}
    size = f"{result.get('statements')} statements"
    if result.get("tensor_elements") is not None:
        size += f", {result['tensor_elements']} tensor elements"
    console.print(
        f"[bold green]repro[/]: {result.get('repro')} ({size}; {result.get('checks')} checks, "
        f"{result.get('seconds', 0):.1f} s)"
    )
    console.print(
        f"verified: {verified.get('reproduced', 0)}/{verified.get('runs', 0)} plain runs "
        f"failed with {result.get('signature_text', 'the signature')}"
    )
    if result.get("cpu_reproduces") is not None:
        console.print(f"CPU reproduces: {'yes' if result['cpu_reproduces'] else 'no'}")
    if result.get("report"):
        console.print(f"report: {result['report']}")
    if result.get("phases"):
        console.print(phases_line(result["phases"]))


def phases_line(phases: dict[str, float]) -> str:
    """Where the time went, phase by phase (some ran side by side)."""
    parts = [f"{phase_label(name)} {seconds:.1f} s" for name, seconds in phases.items()]
    return "[dim]time: " + " · ".join(parts) + "[/]"
