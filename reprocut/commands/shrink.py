"""Turn a recording into a minimal, verified repro.py (and report.md to paste into an issue).

Picks the first recorded case (most public first) that reproduces from its captured inputs,
shrinks it with the named passes against the fork-server oracle, writes repro.py and report.md,
then runs repro.py three times with plain `python`, side by side, to verify it. The seconds of
each phase go to meta.json and --json (`phases`).
Custom kernels (and --source) go through source-level reduction of the original script instead.
REPROCUT_CHECK_LOG=FILE appends a JSON line per check, pass and phase to FILE (where a slow
shrink's time goes); shrinks on one machine share REPROCUT_MACHINE_CHECKS checks in flight
(default: half the cores; 0: no limit).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from reprocut.check.oracle import Oracle
from reprocut.commands.runs import pick_recording
from reprocut.model.errors import ExitCode, MemoryHeldError
from reprocut.model.job import culprit_path
from reprocut.model.limits import CHECK_CAP, SAFETY_CAP
from reprocut.model.memory import CAUSE_HELD
from reprocut.model.oom import format_bytes
from reprocut.model.recording import Failure, RunDir
from reprocut.pipeline.run import Shrunk, shrink_recording
from reprocut.pipeline.settings import ShrinkSettings
from reprocut.report.display.console import print_line
from reprocut.report.display.shrink import print_result
from reprocut.report.held_report import write_held_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        nargs="?",
        type=Path,
        help="a recording's folder or id (default: the latest recording with a failure)",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        metavar="DIR",
        help="where recordings are stored (default: the nearest .reprocut/ here or above)",
    )
    parser.add_argument("--out", type=Path, help="where to write repro.py and report.md")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument(
        "--max-checks",
        type=int,
        default=CHECK_CAP,
        help=f"checks a reduction may run (default {CHECK_CAP}, a safety net)",
    )
    parser.add_argument(
        "--max-time",
        type=float,
        default=None,
        help="seconds a reduction may run (default: none; it runs until a round of passes "
        f"removes nothing, under a {SAFETY_CAP:.0f} s safety cap)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per check (60)")
    parser.add_argument("--no-fork", action="store_true", help="a fresh python per check")
    parser.add_argument("--source", action="store_true", help="reduce the original script")
    parser.add_argument("--runs", type=int, default=3, help="plain verification runs (3)")


def run(options: argparse.Namespace, console: Console) -> ExitCode:
    run_dir = pick_recording(options.run_dir, options.root, console)
    run_dir = RunDir.open(culprit_path(run_dir.path))  # a torchrun job: its culprit rank's
    refuse_held_memory(run_dir.read_failure(), run_dir, options.out)
    settings = ShrinkSettings(
        out=options.out,
        max_checks=options.max_checks,
        max_time=options.max_time,
        timeout=options.timeout,
        fork=not options.no_fork,
        source=options.source,
        runs=options.runs,
    )
    shrunk = shrink_recording(
        run_dir, settings, console, show=not options.json or sys.stderr.isatty()
    )
    if options.json:
        print(json.dumps(shrunk.result, indent=2))
    else:
        show(console, shrunk)
    if not shrunk.reproduced_from_capture:
        print_line(
            console,
            "[yellow]the captured call did not reproduce the failure[/]: repro.py is the "
            "unshrunk candidate. hint: try `reprocut shrink --source`",
        )
    return shrunk.exit_code


def shrink_recorded(
    run_dir: RunDir, failure: Failure, oracle: Oracle | None, console: Console, as_json: bool
) -> tuple[ExitCode, dict[str, Any]]:
    """`record --shrink`: what `reprocut shrink RUN_DIR` does, on the failure record just
    localized, with record's warm oracle. The caller prints the JSON."""
    refuse_held_memory(failure, run_dir)
    shrunk = shrink_recording(
        run_dir,
        ShrinkSettings(),
        console,
        show=not as_json or sys.stderr.isatty(),
        failure=failure,
        oracle=oracle,
    )
    if not as_json:
        show(console, shrunk)
    return shrunk.exit_code, shrunk.result


def refuse_held_memory(failure: Failure, run_dir: RunDir, out: Path | None = None) -> None:
    """An OOM whose request fits the device failed because of what was held, not because of the
    op: a repro of that op alone cannot fail the same way. report.md, the memory account, is
    written all the same (into `out`, else the recording's folder): it is the deliverable."""
    memory = failure.memory
    if memory is None or memory.cause != CAUSE_HELD:
        return
    report = write_held_report(failure, out or run_dir.path, run_dir.path)
    held = format_bytes(memory.reserved_bytes)
    raise MemoryHeldError(
        f"out of memory in {failure.op or 'the script'} only because {held} was already held; "
        f"the request ({format_bytes(memory.requested_bytes)}) alone fits the device, so no "
        f"repro.py was made. What held the memory: {report}",
        hint="report.md is the memory report to attach (with "
        + (f"{run_dir.path / memory.plot}" if memory.plot else "the recording's memory.json")
        + "): free what holds it, then rerun",
    )


def show(console: Console, shrunk: Shrunk) -> None:
    """What people read once the repro is written: its path on stdout, the summary on stderr."""
    print(shrunk.result["repro"])
    print_result(console, {**shrunk.result, "signature_text": shrunk.signature_text})
