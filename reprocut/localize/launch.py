"""A fault from outside PyTorch's dispatcher: a custom kernel launched from the user's code.

Takes the outcome of the blocking rerun, whose line sync names the Python line that launched
the faulting kernel; hands on the outside-dispatcher Failure, with the kernel's name and the
tensors that reached the launch read by one more run stopped at that line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprocut.localize.failure import (
    LocalizeOptions,
    Progress,
    error_info,
    finish,
    location,
    signature_of,
)
from reprocut.localize.kernel_facts import kernel_facts
from reprocut.model.case import SourceLocation, TensorSpec
from reprocut.model.recording import Failure, TensorReport
from reprocut.record.parent.runner import RunResult
from reprocut.report.diagnosis import DIAGNOSES, layout_facts


def outside_dispatcher(
    options: LocalizeOptions,
    first: RunResult,
    outcome: dict[str, Any],
    blocked: dict[str, Any],
    run: RunResult,
    progress: Progress,
) -> Failure:
    error = blocked.get("error", outcome["error"])
    launch = location(blocked.get("surfaced_at"))
    culprit = blocked.get("culprit") or {}
    kernel, tensors = None, ()
    if launch is not None:
        progress(f"reading what reached the launch at {Path(launch.file).name}:{launch.line}")
        kernel, tensors = _launch_inputs(options, launch)
    return finish(
        options,
        Failure(
            status="outside-dispatcher",
            error=error_info(error, run.stderr),
            signature=signature_of(error, run.stderr, None),
            step=blocked.get("step", outcome.get("step")),
            phase=blocked.get("phase"),
            module=culprit.get("module"),
            kernel=kernel,
            source=launch,
            surfaced_at=location(outcome.get("surfaced_at")),
            tensors=tensors,
            diagnosis=DIAGNOSES["layout"],
            localization="rerun",
            device="cuda",
            notes=(
                "the faulting kernel is not a PyTorch op: `reprocut shrink` reduces the script "
                "itself (source-level reduction)",
            ),
        ),
    )


def _launch_inputs(
    options: LocalizeOptions, launch: SourceLocation
) -> tuple[str | None, tuple[TensorReport, ...]]:
    """The launched kernel's name and the tensors reaching the launch, with their layout facts
    and the facts their values show (ids against the table's rows, int32 offsets), read by one
    more run stopped where the launch raises (`reprocut.source.probe.probe_launch`); nothing
    when they cannot be read."""
    from reprocut.source.focus import call_argument_sources, statement_text
    from reprocut.source.probe import probe_launch

    path = Path(launch.file)
    focus = statement_text(path, launch.line) if path.is_file() else None
    if focus is None:
        return None, ()
    probed = probe_launch(
        options.script,
        cwd=options.cwd,
        argv=options.argv,
        file=path,
        line=launch.line,
        focus=focus,
        timeout=options.timeout or 600.0,
        keep=options.run_dir.launch_probe_path,  # `shrink` reads it instead of probing again
    )
    named = [*zip(call_argument_sources(focus), probed.args, strict=False), *probed.params]
    tensors: dict[str, TensorSpec] = {}
    for name, spec in named:
        if spec is not None:
            tensors.setdefault(name, spec)
    values = kernel_facts(probed, list(tensors.items()))
    reports = [
        TensorReport(name, spec, (*layout_facts(spec), *values.get(name, ())))
        for name, spec in tensors.items()
    ]
    return probed.kernel, tuple(reports)
