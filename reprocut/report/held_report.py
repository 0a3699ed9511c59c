"""report.md for an out-of-memory failure that has no repro: the request fits the device and
failed only because other memory was held (a leak, saved activations), so a repro of the op
alone would not fail the same way and `reprocut shrink` exits 9. The memory account
(memory_markdown.py) is then the deliverable: written with the error, where it happened and
the environment, as any report.md is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from reprocut.model.memory import CAUSE_HELD
from reprocut.model.oom import format_bytes
from reprocut.model.recording import Failure, atomic_write
from reprocut.report.markdown import collect_environment, summary_line
from reprocut.report.memory_markdown import code, memory_markdown, where
from reprocut.report.paths import relative_to_folder
from reprocut.shrink.header import Environment


def held_report(failure: Failure, environment: Environment) -> str:
    """report.md for an OOM that failed only because other memory was held: no repro (an
    op-level one with the same shapes would not fail), the memory account instead."""
    memory = failure.memory
    assert memory is not None and memory.cause == CAUSE_HELD
    folder = os.path.dirname(failure.script) if failure.script else ""
    asked = (
        f"the request ({format_bytes(memory.requested_bytes)}) alone fits the device"
        if memory.requested_bytes is not None
        else "the allocation failed"
    )
    held = format_bytes(memory.reserved_bytes)
    parts = [
        f"# {summary_line(failure)}",
        "",
        f"> **No repro.py:** {asked}; it failed because {held} was already held. A repro of "
        f"{code(failure.op or 'the failing op')} alone with the same shapes would not fail the "
        "same way, so reprocut made none: what held the memory, below, is the finding. Free or "
        "shrink what holds it, then rerun.",
        "",
        "## Error",
        "",
        "```",
        f"{failure.error.type}: {failure.error.message.strip()}",
        "```",
        "",
        "## Where it happened in the original program",
        "",
    ]
    if failure.source is not None:
        parts.append(f"- {where(failure.source, folder)}")
    if failure.forward_source is not None:
        parts.append(f"- created in forward at {where(failure.forward_source, folder)}")
    facts = (("op", failure.op), ("module", failure.module), ("phase", memory.phase or failure.phase),
             ("training step", failure.step))  # fmt: skip
    parts += [f"- {name}: {code(str(value))}" for name, value in facts if value is not None]
    parts += ["", *memory_markdown(memory, folder), "", *environment_lines(environment, failure)]
    return relative_to_folder("\n".join(parts) + "\n", folder)


def environment_lines(env: Environment, failure: Failure) -> list[str]:
    return [
        "## Environment",
        "",
        f"- PyTorch: {env.torch}",
        f"- CUDA: {env.cuda or 'none'}",
        f"- GPU driver: {env.driver or 'none'}",
        f"- GPU: {env.gpu or 'none'}",
        f"- Python: {env.python}",
        f"- OS: {env.os}",
        *(f"- {name}: {version}" for name, version in sorted(failure.frameworks.items())),
    ]


def write_held_report(failure: Failure, out: Path, run_dir: Path) -> Path:
    """Write report.md into `out` (the recording's folder unless --out said otherwise), with
    the picture beside it when that is elsewhere, so the report's link holds."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.md"
    atomic_write(report, held_report(failure, collect_environment(failure)))
    plot = failure.memory.plot if failure.memory is not None else None
    if plot and out.resolve() != run_dir.resolve() and (run_dir / plot).exists():
        shutil.copyfile(run_dir / plot, out / plot)
    return report
