"""Run the bundled examples on the CPU and save what reprocut showed, for the docs.

    python docs/tools/pictures.py              # every case (about 10 minutes on 2 cores)
    python docs/tools/pictures.py nan oom      # some of them

Each case runs its commands, as the docs show them, in a copy of examples/ and corpus/, then
writes docs/assets/<case>/:
    record.svg    the panel `record` printed, drawn by the same function (failure_panel, or
                  memory_panel for a run that did not fail) from the recording, saved with
                  rich's own SVG export
    record.json   what `record --json` prints for that recording (the same function)
    shrink.txt    what `reprocut shrink` printed (stderr, as in a log)
    repro.py, report.md, memory.svg   copied from the recording
Paths under the temporary folder are shown relative to it, as from the repository's root (the
folder name and the run id are the only things that differ from a run in a checkout). At the
end sync.py writes the pages' quotes of these files.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import sync
from rich._export_format import CONSOLE_SVG_FORMAT
from rich.console import Console

from reprocut.commands.memory_run import REPORT_FILE
from reprocut.model.job import culprit_path
from reprocut.model.memory import MemoryReport
from reprocut.model.recording import RunDir
from reprocut.report.display.failure import failure_json, failure_panel
from reprocut.report.display.memory import memory_json, memory_panel

REPO = sync.REPO
ASSETS = REPO / "docs" / "assets"
WIDTH = 100  # the width reprocut's console has off a terminal
# rich's SVG template without its @font-face rules, so the picture fetches nothing from the
# network, and with common monospace fonts named before the generic one
MONOSPACE = 'font-family: "Fira Code", "DejaVu Sans Mono", Menlo, Consolas, monospace;'
SVG_FORMAT = re.sub(r"\s*@font-face \{\{.*?\}\}", "", CONSOLE_SVG_FORMAT, flags=re.DOTALL).replace(
    "font-family: Fira Code, monospace;", MONOSPACE
)


@dataclass(frozen=True, slots=True)
class Case:
    name: str  # its folder under docs/assets/
    commands: tuple[str, ...]  # as the docs show them; the first is the record
    cwd: str = "."  # where they run, relative to the repository's root


CASES = (
    Case("embedding", ("reprocut record examples/train_embedding.py", "reprocut shrink")),
    Case("classifier", ("reprocut record examples/train_classifier.py", "reprocut shrink")),
    Case(
        "nan",
        ("reprocut record --nan corpus/nan/nan_fp16_attention_exp/train.py", "reprocut shrink"),
    ),
    Case("oom", ("reprocut record corpus/memory/ranking_broadcast/train.py", "reprocut shrink")),
    Case("leak", ("reprocut record --memory corpus/memory/val_graph_leak/train.py",)),
    Case(
        "compile",
        ("reprocut record corpus/compile/compile_embedding_vocab/train.py", "reprocut shrink"),
    ),
    Case(
        "compile-only",
        ("reprocut record corpus/compile/compile_custom_op_fake_shape/train.py", "reprocut shrink"),
    ),
    Case(
        "notebook",
        ("reprocut record corpus/notebook_tabular_classes/train.ipynb", "reprocut shrink"),
    ),
    Case(
        "pytest",
        ("reprocut record -- pytest -q tests", "reprocut shrink"),
        cwd="corpus/pytest_segment_ops",
    ),
    Case(
        "torchrun",
        (
            "reprocut record -- torchrun --nproc-per-node 2 corpus/distributed/ddp_grown_vocab/train.py",
            "reprocut shrink",
        ),
    ),
)


def relative(text: str, work: Path) -> str:
    """Paths in the work folder as a user in the repository's root sees them."""
    return text.replace(f"{work}/", "").replace(str(work), ".")


def run_case(case: Case, work: Path) -> dict[str, str]:
    """Run the case's commands, `reprocut` being this checkout's run by this Python; the
    stderr of each command."""
    cwd = work / case.cwd
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    outputs = {}
    for command in case.commands:
        words = shlex.split(command)
        argv = [sys.executable, "-m", "reprocut", *words[1:]] if words[0] == "reprocut" else words
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        print(f"  {command}: exit {done.returncode}, {seconds:.1f} s", flush=True)
        outputs[command] = done.stderr
    return outputs


def save_svg(renderable: object, title: str, path: Path) -> None:
    console = Console(
        record=True,
        width=WIDTH,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        highlight=False,
    )
    console.print(renderable)
    console.save_svg(str(path), title=title, code_format=SVG_FORMAT)


def save_recording(case: Case, work: Path, out: Path) -> None:
    """The latest recording's panel, JSON, memory picture and repro."""
    cwd = work / case.cwd
    root = cwd / ".reprocut"
    run = RunDir.latest(root)
    shown = Path(".reprocut") / "runs" / run.path.name  # as record shows it from cwd
    previous = Path.cwd()
    os.chdir(cwd)  # the panel reads the user's source lines by their recorded paths
    try:
        if run.failure_path.exists():
            failure = run.read_failure()
            panel, data = failure_panel(failure, shown), failure_json(failure, shown)
        else:  # `record --memory` on a run that did not fail
            report = MemoryReport.from_json(json.loads((run.path / REPORT_FILE).read_text()))
            panel = memory_panel(report, shown)
            data = {"status": "passed", "run_dir": str(shown), "memory": memory_json(report, shown)}
        save_svg(panel, case.commands[0], out / "record.svg")
    finally:
        os.chdir(previous)
    (out / "record.json").write_text(relative(json.dumps(data, indent=2), cwd) + "\n")
    for source, name in ((run.path / "memory.svg", "memory.svg"),):
        if source.exists():
            shutil.copyfile(source, out / name)
    shrunk = culprit_path(run.path)  # a torchrun job's repro is its culprit rank's
    for name in ("repro.py", "report.md"):
        if (shrunk / name).exists():
            (out / name).write_text(relative((shrunk / name).read_text(), cwd))


def make(case: Case, work: Path) -> None:
    out = ASSETS / case.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"{case.name}:", flush=True)
    outputs = run_case(case, work)
    save_recording(case, work, out)
    shrink = outputs.get("reprocut shrink")
    if shrink is not None:
        (out / "shrink.txt").write_text(relative(shrink, work / case.cwd))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "cases", nargs="*", help=f"cases to run (default: all of {[c.name for c in CASES]})"
    )
    options = parser.parse_args(argv)
    chosen = [c for c in CASES if not options.cases or c.name in options.cases]
    unknown = set(options.cases) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown cases: {sorted(unknown)}")
    with tempfile.TemporaryDirectory(prefix="reprocut-docs-") as folder:
        for case in chosen:
            work = Path(folder) / case.name
            for top in ("examples", "corpus"):
                shutil.copytree(REPO / top, work / top)
            make(case, work)
    return sync.main([])


if __name__ == "__main__":
    sys.exit(main())
