"""What `reprocut record` shows: the failure panel for people, the JSON object for machines."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from reprocut.model.case import Captured, Generated, Literal, SourceLocation, TensorSpec
from reprocut.model.notebook import cell_source, place_of
from reprocut.model.recording import Failure
from reprocut.model.signature import is_nonfinite
from reprocut.report.display.compiled import compile_section
from reprocut.report.display.memory import memory_json, memory_section
from reprocut.report.display.nonfinite import nonfinite_json, nonfinite_section
from reprocut.report.display.ranks import other_ranks, rank_head, ranks_json
from reprocut.report.display.tables import FittedTable
from reprocut.report.paths import shown_path, where_text

TITLES = {
    "localized": "first faulting op found",
    "outside-dispatcher": "fault in a kernel outside PyTorch's dispatcher",
    "not-localized": "failure seen, but not localized",
    "script-error": "the script failed outside torch",
    "nonfinite-input": "a NaN/inf came in from outside the step's ops",
    "compile-only": "fails only under torch.compile",
}


def same_line(a: SourceLocation | None, b: SourceLocation | None) -> bool:
    return a is not None and b is not None and (a.file, a.line) == (b.file, b.line)


def loop_text(loop: dict[str, int]) -> str:
    """`epoch=0, step=41`: the user's loop counters."""
    return ", ".join(f"{name}={value}" for name, value in loop.items())


def source_context(location: SourceLocation, context: int = 3) -> RenderableType:
    """A few syntax-highlighted lines around the user's line, the line itself marked."""
    code = cell_source(location.file)  # a notebook cell: its own lines
    try:
        code = Path(location.file).read_text() if code is None else code
    except OSError:
        return Text(location.text or "(source not available)")
    total = code.count("\n") + 1
    start = max(1, location.line - context)
    end = min(total, location.line + context)
    return Syntax(
        code,
        "python",
        line_numbers=True,
        line_range=(start, end),
        highlight_lines={location.line},
        theme="ansi_dark",
        word_wrap=True,
    )


def _values_label(spec: TensorSpec) -> str:
    if spec.is_sparse:
        return "indices " + _values_label(spec.parts[0]) if spec.parts else "shape only"
    if isinstance(spec.values, Captured):
        return "captured"
    if isinstance(spec.values, Literal):
        return "literal"
    assert isinstance(spec.values, Generated)
    return "shape only"


def tensor_table(failure: Failure) -> FittedTable:
    rows = []
    for row in failure.tensors:
        spec = row.spec
        stride = "contiguous" if spec.stride is None else str(tuple(spec.stride))
        if spec.is_sparse:  # no strides: its layout and stored entries instead
            stride = f"{spec.layout}, nnz {spec.parts[-1].shape[0] if spec.parts else 0}"
        dtype = spec.dtype + (" (grad)" if spec.requires_grad else "")
        rows.append(
            (
                row.name,
                str(tuple(spec.shape)),
                dtype,
                stride,
                str(spec.storage_offset),
                spec.device,
                _values_label(spec),
            )
        )
    return FittedTable(
        ("arg", "shape", "dtype", "stride", "offset", "device", "values"),
        rows,
        title="inputs of the faulting call",
        title_justify="left",
    )


def facts_text(failure: Failure) -> Text:
    lines = []
    for row in failure.tensors:
        for fact in row.facts:
            line = Text(f"  {row.name}: ", style="bold")
            line.append(fact, style="yellow")
            lines.append(line)
    return Text("\n").join(lines)


def op_launch_lines(failure: Failure) -> list[RenderableType]:
    """The deepest line of the user's code inside a custom op (its kernel's launch), with the
    line that called the op beside it."""
    assert failure.launch is not None
    where = where_text(failure.launch, failure.cwd)
    inside = f" (inside {failure.op})" if failure.op else ""
    lines: list[RenderableType] = [Text(f"\nyour code: {where}{inside}", style="bold"),
                                   source_context(failure.launch)]  # fmt: skip
    if failure.source is not None:
        called = Text("called from ", style="bold")
        called.append(where_text(failure.source, failure.cwd), style="cyan")
        if failure.source.text:
            called.append(f"  {failure.source.text}", style="dim")
        lines.append(called)
    return lines


def failure_panel(failure: Failure, run_dir: Path) -> Panel:
    parts: list[RenderableType] = []
    head = Text()
    if failure.rank is not None:
        head.append_text(rank_head(failure))
    if failure.op or failure.public_call:
        head.append("op       ", style="bold")
        head.append(failure.op or "(no aten op raised)", style="bold cyan")
        if failure.public_call:
            head.append(f"   via {failure.public_call}", style="cyan")
        head.append("\n")
    if failure.kernel:
        head.append("kernel   ", style="bold")
        head.append(failure.kernel, style="bold cyan")
        head.append("   (not a PyTorch op)\n", style="dim")
    if failure.test is not None:  # a test has no training step: the test is where
        head.append("test     ", style="bold")
        head.append(failure.test.nodeid, style="bold cyan")
        head.append(f"   line {shown_path(failure.test.file, failure.cwd)}:{failure.test.line}\n")
    elif failure.after_loop is not None:  # the loop had ended: no step was running
        head.append("when     ", style="bold")
        head.append(failure.after_loop.describe())
        if failure.loop:
            head.append(f"   your loop: {loop_text(failure.loop)}", style="cyan")
        head.append("\n")
    elif failure.step is not None:
        head.append("step     ", style="bold")
        head.append(f"{failure.step}" + (f" ({failure.phase})" if failure.phase else ""))
        if failure.loop:
            head.append(f"   your loop: {loop_text(failure.loop)}", style="cyan")
        head.append("\n")
    if failure.module:
        head.append("module   ", style="bold")
        head.append(f"{failure.module}\n")
    head.append("error    ", style="bold")
    code = f" [CUDA error {failure.error.code}]" if failure.error.code is not None else ""
    head.append(f"{failure.error.type}{code}: ", style="bold red")
    head.append(
        failure.error.message.strip().splitlines()[0] if failure.error.message.strip() else ""
    )
    seen = failure.error.surfaced_as
    if seen:  # the script saw another error than the op's own (the op's own is above)
        head.append("\nseen as  ", style="bold")
        said = str(seen.get("message", "")).strip()
        head.append(f"{seen.get('type', '')}: {said.splitlines()[0] if said else ''}")
    parts.append(head)
    if failure.launch is not None:  # a custom op: its implementation's line, then the call
        parts += op_launch_lines(failure)
    elif failure.source is not None:
        label = (
            "your code (forward line of this backward op)"
            if failure.phase == "backward"
            else "your code"
        )
        parts.append(
            Text(
                f"\n{label}: {where_text(failure.source, failure.cwd, missing='unknown')}",
                style="bold",
            )
        )
        parts.append(source_context(failure.source))
    if failure.call_site is not None and not same_line(failure.call_site, failure.source):
        site = Text("torch called from ", style="bold")
        site.append(where_text(failure.call_site, failure.cwd), style="cyan")
        if failure.call_site.text:
            site.append(f"  {failure.call_site.text}", style="dim")
        parts.append(site)
    if failure.tensors:
        parts.append(Text(""))
        parts.append(tensor_table(failure))
        facts = facts_text(failure)
        if facts:
            parts.append(Text("what explains it", style="bold"))
            parts.append(facts)
    if failure.error.assertions:
        assertion = Text("\nkernel assertion", style="bold")
        for item in failure.error.assertions[:3]:
            assertion.append(f"\n  {item['function']}: ")
            assertion.append(f"Assertion `{item['condition']}` failed", style="red")
            assertion.append(f" (block {item['block']}, thread {item['thread']})", style="dim")
        parts.append(assertion)
    if (
        failure.surfaced_at is not None
        and failure.surfaced_at != failure.source
        and not same_line(failure.surfaced_at, failure.launch)  # raised there, not later
    ):
        surfaced = Text("\nwithout blocking, the error surfaced at ", style="bold")
        surfaced.append(
            where_text(failure.surfaced_at, failure.cwd, missing="unknown"), style="magenta"
        )
        if failure.surfaced_at.text:
            surfaced.append(f"  {failure.surfaced_at.text}", style="dim")
        surfaced.append(
            "\n  (CUDA reports errors asynchronously: that traceback pointed at a later line)",
            style="dim",
        )
        parts.append(surfaced)
    if failure.nonfinite is not None:  # --nan: the panel's op is the origin; else traced to it
        full = not is_nonfinite(failure.signature)
        parts.append(nonfinite_section(failure.nonfinite, failure.cwd, full=full))
    if failure.torch_compile is not None:
        parts.append(compile_section(failure.torch_compile))
    if failure.memory is not None:
        parts.append(memory_section(failure.memory, run_dir))
    if failure.diagnosis:
        parts.append(Text("\ndiagnosis", style="bold"))
        parts.append(Text(failure.diagnosis))
    if failure.ranks:
        parts.append(other_ranks(failure))
    for note in failure.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    footer = Text(f"\nrecording: {run_dir}", style="dim")
    if failure.status in ("localized", "outside-dispatcher", "compile-only"):
        footer.append("\nnext: ", style="dim")
        footer.append("reprocut shrink", style="bold green")
        footer.append("  (writes a minimal repro.py and report.md)", style="dim")
    parts.append(footer)
    title = f"reprocut: {TITLES.get(failure.status, failure.status)}"
    if failure.status == "localized" and is_nonfinite(failure.signature):
        title = "reprocut: first op that made a NaN/inf"
    if failure.rank is not None:
        title += f" on rank {failure.rank}"
    if failure.localization and failure.localization != "none":
        title += f" ({failure.localization})"
    return Panel(Group(*parts), title=title, title_align="left", border_style="red")


def show_failure(console: Console, failure: Failure, run_dir: Path) -> None:
    console.print(failure_panel(failure, run_dir))


def panel_text(failure: Failure, run_dir: Path, width: int = 100) -> str:
    """The panel as plain text, as a terminal `width` wide shows it (the facts audit reads it)."""
    console = Console(file=io.StringIO(), width=width, no_color=True, highlight=False)
    console.print(failure_panel(failure, run_dir))
    return console.file.getvalue()  # type: ignore[attr-defined]


def failure_json(failure: Failure, run_dir: Path) -> dict[str, Any]:
    def location(loc: SourceLocation | None) -> dict[str, Any] | None:
        if loc is None:
            return None
        place = place_of(loc.file, loc.line)
        if place is not None:  # the notebook's file, the cell (0-based) and the line in it
            return {"file": place.notebook, "cell": place.cell, "line": loc.line, "text": loc.text}
        return {"file": loc.file, "line": loc.line, "text": loc.text}

    facts = [fact for row in failure.tensors for fact in row.facts]
    return {
        "status": failure.status,
        "op": failure.op,
        "kernel": failure.kernel,
        "public_call": failure.public_call,
        "step": failure.step,
        "after_loop": None if failure.after_loop is None else failure.after_loop.to_json(),
        "phase": failure.phase,
        "module": failure.module,
        "source": location(failure.source),
        "forward_source": location(failure.forward_source),
        "call_site": location(failure.call_site),
        "launch": location(failure.launch),
        "loop": dict(failure.loop),
        "frameworks": dict(failure.frameworks),
        "error": failure.error.to_json(),
        "surfaced_at": location(failure.surfaced_at),
        "signature": {
            "error_type": failure.signature.error_type,
            "error_code": failure.signature.error_code,
            "op": failure.signature.op,
            "kind": failure.signature.kind,
        },
        "tensors": [row.to_json() for row in failure.tensors],
        "facts": facts,
        "diagnosis": failure.diagnosis,
        "localization": failure.localization,
        "device": failure.device,
        "notes": list(failure.notes),
        "run_dir": str(run_dir),
        "test": None if failure.test is None else failure.test.to_json(),
        "nonfinite": None if failure.nonfinite is None else nonfinite_json(failure.nonfinite),
        "torch_compile": None if failure.torch_compile is None else failure.torch_compile.to_json(),
        "memory": None if failure.memory is None else memory_json(failure.memory, run_dir),
        **(ranks_json(failure) if failure.rank is not None else {}),
    }
