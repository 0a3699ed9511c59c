"""A script reduction's command from its launch: this tree against another checkout, N at once.

`reprocut shrink --source` spends its first seconds starting: the command's imports, the fork
server's `import torch`, the processes it starts ahead. bench_source_speed.py times the reducer
inside one process and misses them; this launches the command itself on a recording of a
source case, `--jobs` of them at once (each on its own copy), this tree's and `--tree`'s runs
alternating round by round, and reads each command's check log (`REPROCUT_CHECK_LOG`): seconds
from the launch to its first phase, to its fork server's readiness and to its first check's
end, and to the command's exit; checks and the repro's non-blank lines beside them, so that a
faster start that writes a larger repro shows. The recording is made once, by this tree.

    python benchmarks/bench_shrink_start.py --tree PATH [--jobs 1 2] [--rounds 4] [--case numpy_kernel]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "benchmarks" / "source_cases"
FIGURES = ("first_phase", "server", "first_check", "total", "checks", "lines")


def launch(tree: Path, work: Path) -> tuple[subprocess.Popen[str], float, Path]:
    """`reprocut shrink --source` of `tree` in `work`, its check log beside it."""
    log = work / "checks.jsonl"
    env = {**os.environ, "PYTHONPATH": str(tree), "REPROCUT_CHECK_LOG": str(log)}
    command = [sys.executable, "-m", "reprocut", "shrink", "--source", "--json", "--out", "out"]
    started = time.time()
    process = subprocess.Popen(command, cwd=work, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    return process, started, log


def figures(started: float, ended: float, log: Path, result: dict[str, Any], repro: Path) -> dict[str, Any]:  # fmt: skip
    """One command's seconds from its launch (the check log's wall-clock stamps), and sizes."""
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    checks = [e["t"] for e in events if e.get("kind") == "check"]
    server = [e["t"] for e in events if e.get("phase") == "fork_server" and "seconds" in e]
    return {
        "first_phase": events[0]["t"] - started if events else None,
        "server": server[0] - started if server else None,
        "first_check": min(checks) - started if checks else None,
        "total": ended - started,
        "checks": result.get("checks"),
        "lines": sum(1 for line in repro.read_text().splitlines() if line.strip())
        if repro.exists() else None,
    }  # fmt: skip


def measure(trees: dict[str, Path], case: str, jobs: int, rounds: int, scratch: Path) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Every tree's commands, `jobs` at once, the trees' order swapped each round."""
    project = scratch / "project"
    shutil.copytree(CASES / case, project)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "reprocut", "record", "--quiet", "train.py"],
                   cwd=project, env=env, capture_output=True, check=False, timeout=600)  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    order = list(trees)
    for number in range(rounds):
        for name in order if number % 2 == 0 else order[::-1]:
            started = []
            for job in range(jobs):
                work = scratch / f"{name}-{number}-{job}"
                shutil.copytree(project, work)
                started.append((work, *launch(trees[name], work)))
            for work, process, at, log in started:
                out, _ = process.communicate(timeout=900)
                ended = time.time()
                result = json.loads(out) if out.strip() else {}
                runs[name].append(figures(at, ended, log, result, work / "out" / "repro.py"))
    return runs


def _commit(where: Path) -> str:
    done = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip() or "unknown"


def report(runs: dict[int, dict[str, list[dict[str, Any]]]], trees: dict[str, Path], command: str) -> str:  # fmt: skip
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# A script reduction's command from its launch (cpu)",
        "",
        f"{now}, Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} "
        f"cores; the trees alternating round by round. Command: `{command}`.",
        "",
        "Medians over the runs, seconds from each command's launch: to its first phase (its "
        "imports done), to its fork server's readiness, to its first check's end, and to its "
        "exit (`total`); `checks` and the repro's non-blank `lines` beside them.",
        "",
        "| at once | tree | commit | runs | " + " | ".join(FIGURES) + " | totals |",
        "|" + "---|" * (len(FIGURES) + 5),
    ]
    for jobs, by_tree in runs.items():
        for name, rows in by_tree.items():
            medians = []
            for figure in FIGURES:
                values = [row[figure] for row in rows if row[figure] is not None]
                medians.append(f"{statistics.median(values):.2f}" if values else "")
            totals = ", ".join(f"{row['total']:.1f}" for row in rows)
            lines.append(f"| {jobs} | {name} | {_commit(trees[name])} | {len(rows)} | "
                         + " | ".join(medians) + f" | {totals} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="another checkout to compare")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="commands at once")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--case", default="numpy_kernel", choices=sorted(p.name for p in CASES.iterdir() if p.is_dir()))  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/shrink-start-cpu.md")
    args = parser.parse_args(argv)
    trees = {"this tree": ROOT, "--tree": args.tree.resolve()}
    runs = {}
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory(prefix="reprocut-start-") as scratch:
            runs[jobs] = measure(trees, args.case, jobs, args.rounds, Path(scratch))
    command = (f"python benchmarks/bench_shrink_start.py --tree {args.tree} --jobs "
               f"{' '.join(map(str, args.jobs))} --rounds {args.rounds} --case {args.case}")  # fmt: skip
    text = report(runs, trees, command)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
