"""List the recordings (script, when, status, op) or delete old ones.

Recordings are found in ./.reprocut/ or the nearest parent folder that has one (or --root).
The one marked * is what `reprocut shrink` takes when given no run directory: the latest
recording with a failure. `--clean` deletes all but the newest --keep recordings.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from reprocut.model.errors import ExitCode, NoRecordingError
from reprocut.model.recording import RunDir
from reprocut.model.runs import clean, latest_failed, list_runs, require_root
from reprocut.report.display.runs import print_cleaned, print_picked, print_runs

DEFAULT_KEEP = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        metavar="DIR",
        help="where recordings are stored (default: the nearest .reprocut/ here or above)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--clean", action="store_true", help="delete old recordings")
    parser.add_argument(
        "--keep",
        type=int,
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"with --clean: how many of the newest to keep (default {DEFAULT_KEEP})",
    )


def run(options: argparse.Namespace, console: Console) -> ExitCode:
    root = require_root(options.root)
    if options.clean:
        deleted, kept = clean(root, options.keep)
        if options.json:
            print(json.dumps({"root": str(root), "deleted": [s.run.id for s in deleted],
                              "kept": [s.run.id for s in kept]}, indent=2))  # fmt: skip
        else:
            print_cleaned(console, root, deleted, kept)
        return ExitCode.OK
    runs = list_runs(root)
    picked = next((summary for summary in reversed(runs) if summary.has_failure), None)
    if options.json:
        print(json.dumps({"root": str(root), "runs": [s.to_json() for s in runs],
                          "shrink_default": None if picked is None else picked.run.id},
                         indent=2))  # fmt: skip
    else:
        print_runs(console, root, runs, picked)
    return ExitCode.OK


def pick_recording(run_dir: Path | None, root: Path | None, console: Console) -> RunDir:
    """The recording `shrink` works on: `run_dir` (a folder, or a run id under the root), else
    the latest with a failure under `root` or the nearest .reprocut/, saying which it took."""
    if run_dir is not None:
        if run_dir.is_dir() or len(run_dir.parts) > 1:
            return RunDir.open(run_dir)
        by_id = require_root(root) / "runs" / run_dir.name
        if not by_id.is_dir():
            raise NoRecordingError(
                f"{run_dir} is neither a folder nor a recording under {by_id.parent.parent}/",
                hint="`reprocut runs` lists the recordings",
            )
        return RunDir.open(by_id)
    picked, passed_over = latest_failed(require_root(root))
    print_picked(console, picked, passed_over)
    return picked.run
