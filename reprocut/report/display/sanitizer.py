"""What `reprocut sanitize` (and shrink, where it ran memcheck) shows of compute-sanitizer's
findings: a short panel on a terminal, plain lines otherwise."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text


def print_evidence(console: Console, evidence: dict[str, Any]) -> None:
    """`evidence`: check/sanitizer.py's Evidence.to_json()."""
    status = evidence.get("status")
    if status != "found":
        console.print(f"[yellow]compute-sanitizer[/]: {evidence.get('note') or status}")
        return
    body = Text("\n".join(evidence.get("findings") or ()))
    if evidence.get("log"):
        body.append(f"\nfull report: {evidence['log']}", style="dim")
    seconds = evidence.get("seconds") or 0
    title = f"compute-sanitizer memcheck ({seconds:.1f} s)"
    console.print(Panel(body, title=title, title_align="left", expand=False))
