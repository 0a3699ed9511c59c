"""Run a recording's repro.py under compute-sanitizer's memcheck and name what it touched.

memcheck names the kernel, the access (read or write, its size), the thread and block, the
address and the host backtrace; reprocut adds which of the repro's tensors the address is next
to ("reads 4 B at 3.5 GiB before the start of `x` (arg 0)"). The repro runs with
PYTORCH_NO_CUDA_MEMORY_CACHING=1, so the caching allocator hides no overrun. `reprocut shrink`
does this on its own for memory faults; this command runs it again, or on a repro you edited.
Without compute-sanitizer on PATH it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from reprocut.check.sanitizer import annotate, run_memcheck
from reprocut.model.errors import ExitCode, ReprocutError
from reprocut.model.recording import RunDir, atomic_write
from reprocut.report.display.sanitizer import print_evidence


class NoReproError(ReprocutError):
    slug = "no-repro"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", nargs="?", type=Path, help="a recording (default: the latest)")
    parser.add_argument("--repro", type=Path, help="the script to check (default: its repro.py)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--annotate", action="store_true", help="also write the findings into the repro's docstring"
    )


def run(options: argparse.Namespace, console: Console) -> ExitCode:
    repro = options.repro
    if repro is None:
        run_dir = RunDir.open(options.run_dir) if options.run_dir else RunDir.latest()
        repro = run_dir.path / "repro.py"
    if not repro.is_file():
        raise NoReproError(
            f"{repro} does not exist", hint="run `reprocut shrink` first, or pass --repro FILE"
        )
    evidence = run_memcheck(repro, timeout=options.timeout)
    if options.annotate and evidence.status == "found":
        atomic_write(repro, annotate(repro.read_text(), evidence.header_lines()))
    if options.json:
        print(json.dumps(evidence.to_json(), indent=2))
    else:
        print_evidence(console, evidence.to_json())
    return ExitCode.OK
