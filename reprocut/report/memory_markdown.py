"""report.md's account of an out-of-memory failure: the request and why it is that big, who
held the memory (by role and by the line that made it), growth and the leak with its retainer
path and fix, fragmentation, and the files to attach (the picture, the allocator snapshot).

report.md is what users attach to an issue and read: markdown.py adds this section to every
report of an OOM, and held_report.py makes it the whole report where there is no repro.
"""

from __future__ import annotations

from reprocut.model.case import SourceLocation
from reprocut.model.memory import Leak, MemoryReport
from reprocut.model.oom import format_bytes
from reprocut.report.paths import where_text

MEMORY_VIZ = "https://pytorch.org/memory_viz"


def code(text: str) -> str:
    return f"`{text.replace('`', '')}`"


def where(location: SourceLocation | None, folder: str) -> str:
    if location is None:
        return "an unknown line"
    where = code(where_text(location, folder))
    return f"{where}: {code(location.text.strip())}" if location.text.strip() else where


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
    lines += [f"| {' | '.join(cell.replace('|', '/') for cell in row)} |" for row in rows]
    return lines


def _path_lines(title: str, text: str, path: tuple[str, ...], fix: str) -> list[str]:
    lines = [f"- **{title}:** {text}", "", "  ```text"]
    lines += [f"  {'   ' * i}{'-> ' if i else ''}{step}" for i, step in enumerate(path)]
    return [*lines, "  ```", "", f"  Fix: {fix}"]


def memory_markdown(report: MemoryReport, folder: str = "") -> list[str]:
    """The `## Out of memory` section (or `## Memory` for a run that did not fail)."""
    failed = report.failing_step is not None or report.requested_bytes is not None
    lines = ["## Out of memory" if failed else "## Memory", ""]
    if report.requested_bytes is not None:
        asked = f"- asked for **{format_bytes(report.requested_bytes)}**"
        if report.device_total_bytes is not None:
            asked += f"; the device: {format_bytes(report.device_total_bytes)} in all"
            if report.device_free_bytes is not None:
                asked += f", {format_bytes(report.device_free_bytes)} free"
        lines.append(asked)
    if report.failing_step is not None:
        lines.append(
            f"- at step {report.failing_step}" + (f", {report.phase}" if report.phase else "")
        )
    lines += [f"- why: {sentence}" for sentence in report.why]
    lines += _holders(report, folder)
    lines += [f"- note: {note}" for note in report.notes]
    if report.held_by is not None:
        held = report.held_by
        lines += ["", "### What keeps it alive", ""]
        lines += _path_lines("Held by", held.text, held.retainer, held.fix)
    lines += ["", "### Growth across steps", ""]
    if report.evidence is not None:
        lines.append(f"- {report.evidence.reason}")
    else:
        lines.append("- too few steps were measured to say")
    if report.leak is not None:
        lines += _leak(report.leak, folder)
    if report.fragmentation is not None:
        lines += ["", "### Fragmentation", "", f"- {report.fragmentation.text}"]
    lines += _files(report)
    return lines


def _holders(report: MemoryReport, folder: str) -> list[str]:
    lines: list[str] = []
    if report.held:
        total = sum(size for _, size in report.held)
        figure = report.reserved_bytes if report.reserved_bytes is not None else total
        allocated = report.allocated_bytes
        said = (
            f"{format_bytes(figure)} reserved" if report.device != "cpu" else format_bytes(figure)
        )
        if allocated is not None and report.device != "cpu":
            said = f"{format_bytes(allocated)} allocated, {said}"
        rows = [(role, format_bytes(size), f"{size / figure:.0%}" if figure else "")
                for role, size in report.held]  # fmt: skip
        source = (
            "live at the failure" if report.device == "cpu" else "the allocator's, at the failure"
        )
        lines += ["", f"### Who held the memory ({said}, {source})"]
        lines += ["", *_table(("held by", "bytes", "share"), rows)]
    if report.top:
        rows = [(where(h.line, folder), h.op or "", h.module or "", format_bytes(h.bytes))
                for h in report.top[:8]]  # fmt: skip
        lines += ["", "### Largest holders, by the line that made them", ""]
        lines += _table(("made at", "op", "module", "live"), rows)
    return lines


def _leak(leak: Leak, folder: str) -> list[str]:
    lines = ["", *_path_lines("Leak", leak.text, leak.retainer, leak.fix)]
    if leak.line is not None:
        lines.append(f"- what outlives its step is made at {where(leak.line, folder)}")
    if leak.kept_at is not None:
        lines.append(f"- stored at {where(leak.kept_at, folder)}")
    return lines


def _files(report: MemoryReport) -> list[str]:
    lines = ["", "### Files", ""]
    if report.plot:
        lines.append(
            f"- [{report.plot}]({report.plot}): memory per step and the failed request against "
            "the device (in the recording's folder; attach it with this report)"
        )
    if report.snapshot:
        lines.append(
            f"- `{report.snapshot}`: the allocator's snapshot at the failure; open it at "
            f"{MEMORY_VIZ}"
        )
    if not report.plot and not report.snapshot:
        lines.append("- none: no step was measured and no allocator snapshot was taken")
    lines += [f"- skipped: {s.stage}: {s.reason}" for s in report.skipped]
    return lines
