"""The memory section of `record`'s output: the request and why, who holds the memory, growth,
the leak and its retainer, fragmentation, the picture; and the same as JSON."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from reprocut.model.case import SourceLocation
from reprocut.model.memory import CAUSE_HELD, MemoryReport
from reprocut.model.oom import format_bytes
from reprocut.report.display.tables import FittedTable
from reprocut.report.paths import where_text


def _line(location: SourceLocation | None) -> str:
    """The file relative to its own folder (the table fits 80 columns), or the notebook cell."""
    return where_text(location, "" if location is None else os.path.dirname(location.file))


def memory_section(report: MemoryReport, run_dir: Path, *, limit: int = 5) -> RenderableType:
    parts: list[RenderableType] = [Text("\nmemory", style="bold")]
    head = Text()
    if report.requested_bytes is not None:
        head.append("  asked for ", style="bold")
        head.append(format_bytes(report.requested_bytes), style="bold red")
        if report.device_total_bytes is not None:
            head.append(f"   device: {format_bytes(report.device_total_bytes)} in all")
            if report.device_free_bytes is not None:
                head.append(f", {format_bytes(report.device_free_bytes)} free")
        head.append("\n")
    if report.phase and report.failing_step is not None:
        head.append("  phase: ", style="bold")
        head.append(f"{report.phase}\n")
    for sentence in report.why:
        head.append("  why: ", style="bold")
        head.append(f"{sentence}\n", style="yellow")
    if report.evidence is not None:
        head.append("  growth: ", style="bold")
        head.append(f"{report.evidence.reason}\n", style="red" if report.evidence.claimed else "")
    parts.append(head)
    if report.leak is not None:
        leak = Text("  leak: ", style="bold")
        leak.append(report.leak.text + "\n", style="red")
        for i, step in enumerate(report.leak.retainer):
            leak.append(f"    {'   ' * i}{'-> ' if i else ''}{step}\n")
        leak.append("  fix: ", style="bold")
        leak.append(report.leak.fix + "\n", style="green")
        parts.append(leak)
    if report.held_by is not None:
        held_by = Text("  held by: ", style="bold")
        held_by.append(report.held_by.text + "\n", style="red")
        for i, step in enumerate(report.held_by.retainer):
            held_by.append(f"    {'   ' * i}{'-> ' if i else ''}{step}\n")
        held_by.append("  fix: ", style="bold")
        held_by.append(report.held_by.fix + "\n", style="green")
        parts.append(held_by)
    if report.held:
        total = sum(size for _, size in report.held)
        figure = report.reserved_bytes if report.reserved_bytes is not None else total
        rows = [(role, format_bytes(size)) for role, size in report.held]
        parts.append(
            FittedTable(
                ("held by", "bytes"),
                rows,
                title=f"who holds the memory ({format_bytes(figure)})",
                title_justify="left",
            )
        )
    if report.top:
        rows = [
            (_line(h.line), h.op or "", h.module or "", format_bytes(h.bytes))
            for h in report.top[:limit]
        ]
        parts.append(
            FittedTable(
                ("made at", "op", "module", "live"),
                rows,
                title="largest holders, by the line that made them",
                title_justify="left",
            )
        )
    parts += [Text(f"  note: {note}") for note in report.notes]
    if report.fragmentation is not None:
        parts.append(Text(f"  fragmentation: {report.fragmentation.text}"))
    files = Text()
    if report.plot:
        files.append("  picture: ", style="bold")
        files.append(f"{run_dir / report.plot}\n", style="cyan")
    if report.snapshot:
        files.append("  allocator snapshot: ", style="bold")
        files.append(f"{run_dir / report.snapshot}", style="cyan")
        files.append("  (open at pytorch.org/memory_viz)\n", style="dim")
    for skipped in report.skipped:
        files.append("  skipped: ", style="bold")
        files.append(f"{skipped.stage}: {skipped.reason}\n", style="yellow")
    if report.cause == CAUSE_HELD:
        files.append(
            "  the request failed only because other memory was held: `reprocut shrink` "
            "points here instead of writing an op-level repro\n",
            style="dim",
        )
    parts.append(files)
    return Group(*parts)


def memory_panel(report: MemoryReport, run_dir: Path) -> Panel:
    """A `record --memory` run that did not fail."""
    title = "reprocut: memory grows" if report.leak else "reprocut: memory per step"
    return Panel(
        Group(memory_section(report, run_dir), Text(f"recording: {run_dir}", style="dim")),
        title=title,
        title_align="left",
        border_style="yellow" if report.leak else "green",
    )


def show_memory(console: Console, report: MemoryReport, run_dir: Path) -> None:
    console.print(memory_panel(report, run_dir))


def memory_json(report: MemoryReport, run_dir: Path) -> dict[str, Any]:
    """The `memory` object of `--json`."""
    data = report.to_json()
    leak = data.get("leak")
    if leak is not None:
        line = leak.get("line")
        leak["line"] = None if line is None else f"{line['file']}:{line['line']}"
    data["top"] = [
        {**h, "line": None if h["line"] is None else f"{h['line']['file']}:{h['line']['line']}"}
        for h in data["top"]
    ]
    for key in ("plot", "snapshot"):
        if data.get(key):
            data[key] = str(run_dir / data[key])
    return data
