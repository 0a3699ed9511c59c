"""A recording ▶ a shrunk, verified repro.py and report.md: what `reprocut shrink` does, and
`reprocut record --shrink` after its recording.

Reads the recording, shrinks its captured call (or, for custom kernels and --source, the
script), writes repro.py, verifies it with plain `python repro.py` runs and writes report.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from reprocut.check.oracle import Oracle
from reprocut.check.verify import verify
from reprocut.model.errors import CorruptRecordingError, ExitCode, ReprocutError
from reprocut.model.recording import RunDir, atomic_write
from reprocut.pipeline.cases import shrink_case
from reprocut.pipeline.finish import report_inputs, result_json
from reprocut.pipeline.scripts import shrink_source
from reprocut.report.display.shrink import print_phase, shrink_display
from reprocut.report.markdown import collect_environment, render


class NothingToShrinkError(ReprocutError):
    slug = "script-error"
    exit_code = ExitCode.SCRIPT_ERROR


@dataclass(frozen=True, slots=True)
class ShrinkSettings:
    """What a shrink may do (the `reprocut shrink` options)."""

    out: Path | None = None  # default: the run folder
    max_checks: int = 500
    max_time: float = 300.0
    timeout: float = 60.0  # per check; plain runs get twice that
    fork: bool = True
    source: bool = False
    runs: int = 3


@dataclass(frozen=True, slots=True)
class Shrunk:
    """The result object (`--json`), what it says in words, and the exit code."""

    result: dict[str, Any]
    signature_text: str
    reproduced_from_capture: bool
    exit_code: ExitCode


def load_inputs(run: RunDir) -> dict[str, Any]:
    if not run.inputs_path.exists():
        return {}
    import torch

    try:
        data = torch.load(run.inputs_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptRecordingError(
            f"{run.inputs_path} cannot be read: {exc}",
            hint="record the script again with `reprocut record`",
        ) from exc
    if not isinstance(data, dict):
        raise CorruptRecordingError(f"{run.inputs_path} does not hold a dict of tensors")
    return data


def shrink_recording(
    run_dir: RunDir, settings: ShrinkSettings, console: Console, *, show: bool
) -> Shrunk:
    started = time.monotonic()
    failure = run_dir.read_failure()
    if failure.status == "script-error" and not settings.source:
        raise NothingToShrinkError(
            f"the recorded failure is not in a torch op ({failure.error.type}: "
            f"{failure.error.message.strip().splitlines()[0] if failure.error.message.strip() else ''})",
            hint="fix the script error first; `--source` reduces the script anyway",
        )
    out = (settings.out or run_dir.path).resolve()
    out.mkdir(parents=True, exist_ok=True)
    environment = collect_environment(failure)
    oracle = Oracle(failure.signature, fork=settings.fork, timeout=settings.timeout)
    limits = {"max_checks": settings.max_checks, "max_time": settings.max_time}
    try:
        with shrink_display(console, enabled=show) as on_event:
            if settings.source or failure.status == "outside-dispatcher" or not failure.cases:
                if (
                    not failure.cases
                    and not settings.source
                    and failure.status != "outside-dispatcher"
                ):
                    print_phase(console, "no captured call to shrink: reducing the script instead")
                outcome = shrink_source(failure, oracle, on_event=on_event, **limits)
            else:
                inputs = load_inputs(run_dir)
                outcome = shrink_case(
                    failure,
                    inputs,
                    oracle,
                    out=out,
                    environment=environment,
                    on_event=on_event,
                    **limits,
                )
    finally:
        oracle.close()
    if oracle.fork_disabled:
        console.print(f"[yellow]note[/]: checks ran in fresh processes ({oracle.fork_disabled})")
    repro = out / "repro.py"
    atomic_write(repro, outcome.code)
    print_phase(console, f"verifying: {settings.runs} runs of python {repro.name}")
    verification = verify(
        repro, failure.signature, runs=settings.runs, timeout=settings.timeout * 2
    )
    seconds = time.monotonic() - started
    report = out / "report.md"
    atomic_write(
        report, render(report_inputs(outcome, failure, environment, verification, seconds))
    )
    result = result_json(outcome, failure.signature, verification, repro, report, seconds)
    exit_code = verification.exit_code if outcome.reproduced_from_capture else None
    return Shrunk(
        result,
        failure.signature.describe(),
        outcome.reproduced_from_capture,
        exit_code if exit_code is not None else ExitCode.NOT_REPRODUCED,
    )
