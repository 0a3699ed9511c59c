"""`record --memory` on a run that did not fail: memory per step, and when it grows, the line
whose allocations outlive their step and what keeps them alive."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from reprocut.localize.leak_text import short
from reprocut.localize.memory import build_report, read_memory
from reprocut.model.errors import ExitCode
from reprocut.model.recording import RunDir, atomic_write
from reprocut.report.display.memory import memory_json, show_memory

REPORT_FILE = "memory_report.json"


def report_passed(options: argparse.Namespace, console: Console, run_dir: RunDir) -> ExitCode:
    report = build_report(None, read_memory(run_dir), run_dir.path)
    atomic_write(run_dir.path / REPORT_FILE, json.dumps(report.to_json(), indent=2))
    meta = run_dir.read_meta()
    meta["leak"] = None if report.leak is None else short(report.leak.line)
    run_dir.write_meta(meta)
    if options.json:
        out = {"status": "passed", "run_dir": str(run_dir.path)}
        print(json.dumps({**out, "memory": memory_json(report, run_dir.path)}, indent=2))
    else:
        show_memory(console, report, run_dir.path)
    return ExitCode.OK
