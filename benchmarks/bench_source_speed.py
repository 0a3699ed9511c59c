"""What a source-reduction check costs, and how many run: reprocut's reducer in several configurations.

Each (case, configuration) runs in a fresh `python` of its own (nothing cached between them),
on a clean copy of the case folder, with the tensors at the failing call probed first (not
counted); its result is verified by a fresh run, as in bench_source.py. Configurations:

    sequential   one candidate at a time, the fork server imports torch only
    preload      ... and the script's installed packages (check/preload.py)
    parallel     ... and a pass's candidates N at a time (source/speculation.py)
    tree         the reducer of another checkout (`--tree PATH`: the code before this change)

    python benchmarks/bench_source_speed.py                        # CPU cases, all configurations
    python benchmarks/bench_source_speed.py --device cuda --configs sequential parallel --jobs 3

`--jobs J` runs J cases side by side (each case's configurations still one after another).
Writes benchmarks/results/source-speed-<device>.md and .json (or --out) with the machine, date and
command; a rerun overwrites them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if "REPROCUT_BENCH_TREE" not in os.environ:  # a `tree` run has that checkout first on its path
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_source  # noqa: E402
from benchmarks.size_trend import Sized, read_previous, trend_lines  # noqa: E402
from reprocut.model.case import Signature  # noqa: E402

# reprocut.model.limits.SAFETY_CAP, not imported: a --tree checkout may predate it (and then
# needs a number for its max_time)
SAFETY_CAP = 600.0

CONFIGS = ("tree", "sequential", "preload", "parallel")
GPU_CASES = (*bench_source.GPU_CASES, "cuda_triton_int32_offsets", "cuda_cupy_hashed_ids",
             "cuda_cublas_transposed_keys")  # fmt: skip


def cpu_cases() -> list[bench_source.SourceCase]:
    return [
        *bench_source.cpu_cases(),
        bench_source.SourceCase(
            "hf_pooler",
            ROOT / "benchmarks" / "source_cases" / "hf_pooler",
            Signature(
                "RuntimeError",
                None,
                None,
                "masked_mean: illegal memory access (read <n> elements from a buffer of <n>)",
            ),
            focus="pooled = masked_mean(hidden, mask)",
        ),
    ]


def cases_for(device: str) -> tuple[list[bench_source.SourceCase], list[str]]:
    cases, skipped = cpu_cases(), []
    if device == "cuda":
        for name in GPU_CASES:
            found = bench_source.corpus_case(name)
            (skipped.append if isinstance(found, str) else cases.append)(found)  # type: ignore[arg-type]
    return cases, skipped


# --- one run, in its own process ----------------------------------------------------------------


def run_one(case: bench_source.SourceCase, config: str, options: argparse.Namespace) -> dict:
    """`reduce_source` on a clean copy of the case, as `config` says; what it cost."""
    from reprocut.source.reducer import reduce_source

    kwargs: dict[str, Any] = {}
    if config in ("sequential", "preload", "parallel"):
        kwargs["preload"] = config != "sequential"
        kwargs["parallel"] = options.parallel if config == "parallel" else 1
        kwargs["message"] = case.message or None  # (a --tree checkout may predate it)
    with tempfile.TemporaryDirectory(prefix=f"speed-{case.name}-") as tmp:
        work = Path(tmp) / "case"
        shutil.copytree(
            case.folder, work, ignore=shutil.ignore_patterns("__pycache__", ".reprocut")
        )
        started = time.perf_counter()
        result = reduce_source(
            work / case.script, cwd=work, argv=list(case.argv), expected=case.expected,
            specs=case.specs, named_specs=case.named_specs, named_values=case.named_values,
            focus=case.focus, timeout=options.timeout, **kwargs,
            max_time=options.max_time or (SAFETY_CAP if config == "tree" else None),
        )  # fmt: skip
        seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 2),
        "checks": result.checks,
        "lines": result.lines,
        "stopped": result.stopped,
        "code": result.code,
        "verified": bench_source.verify(case, result.code, options.timeout),
        "parallel": getattr(result, "parallel", 1),
        "discarded": getattr(result, "discarded", 0),
        "known": getattr(result, "known_failures", 0),
        "preloaded": list(getattr(result, "preloaded", ())),
    }


def run_in_subprocess(name: str, config: str, options: argparse.Namespace, probed: Path) -> dict:
    tree = Path(options.tree).resolve() if config == "tree" else ROOT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)]),
           "REPROCUT_BENCH_TREE": str(tree)}  # fmt: skip
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_source_speed.py"), "--one", name,
               config, "--probed", str(probed), "--device", options.device,
               "--timeout", str(options.timeout), "--parallel", str(options.parallel),
               *(["--max-time", str(options.max_time)] if options.max_time else [])]  # fmt: skip
    limit = (options.max_time or SAFETY_CAP) + 4 * options.timeout + 120
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {limit:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


# --- the table ------------------------------------------------------------------------------------


def bench_case(case: bench_source.SourceCase, options: argparse.Namespace) -> list[dict]:
    case = bench_source.with_probed_specs(case, 600.0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="speed-probe-") as tmp:
        probed = Path(tmp) / "case.pickle"
        probed.write_bytes(pickle.dumps((case.specs, case.named_specs, case.named_values)))
        for config in options.configs:
            row = {"case": case.name, "config": config,
                   **run_in_subprocess(case.name, config, options, probed)}  # fmt: skip
            print(json.dumps({k: v for k, v in row.items() if k != "code"}), file=sys.stderr)
            with options.partial.open("a") as partial:  # what is done survives a time limit
                partial.write(json.dumps(row) + "\n")
            rows.append(row)
    return rows


def report(rows: list[dict], skipped: list[str], options: argparse.Namespace, wall: float) -> str:
    base = {r["case"]: r for r in rows if r["config"] == "sequential" and "code" in r}
    lines = [
        f"# Source reduction: the cost of each check ({options.device})",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.node() or 'host'}, Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cores; {_limit(options)}, {options.timeout:.0f} s "
        f"per check; parallel = {options.parallel} candidates at once; {options.jobs} case(s) "
        f"side by side; wall time {wall:.0f} s. Command: "
        f"`{' '.join(['python benchmarks/bench_source_speed.py', *sys.argv[1:]])}`.",
        "",
        "`checks`: verdicts the reducer used (a one-at-a-time run's count); `discarded`: "
        "speculative checks cancelled or dropped once an earlier candidate was accepted; "
        "`known`: candidates not run, their code up to the statement where a checked one raised "
        "another failure being that one's (reprocut.source.failed_prefix); "
        "`s/check`: seconds / checks; `same`: the final script is the `sequential` one, "
        "character for character; `verified`: a fresh `python` of the result, in a clean copy "
        "of the case, fails the same way.",
        "",
        "| case | config | checks | discarded | known | seconds | s/check | final lines | verified | same | stopped | preloaded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['config']} | error: {r['error']} ||||||||||")
            continue
        same = (
            "" if r["case"] not in base else "yes" if r["code"] == base[r["case"]]["code"] else "no"
        )
        per = r["seconds"] / max(r["checks"], 1)
        lines.append(
            f"| {r['case']} | {r['config']} | {r['checks']} | {r['discarded']} | {r.get('known', 0)} | "
            f"{r['seconds']:.1f} | {per:.3f} | {r['lines']} | {'yes' if r['verified'] else 'no'} "
            f"| {same} | {r['stopped']} | {', '.join(r['preloaded']) or '-'} |"
        )
    if skipped:
        lines += ["", "Skipped:", *(f"- {reason}" for reason in skipped)]
    return "\n".join(lines) + "\n"


def _limit(options: argparse.Namespace) -> str:
    if options.max_time is None:
        return f"each run to its fixed point (no limit; the safety cap {SAFETY_CAP:.0f} s)"
    return f"limit {options.max_time:.0f} s per run"


def sizes(rows: list[dict]) -> list[Sized]:
    """Each row's repro size (lines) beside its seconds (this file's JSON rows, older ones too)."""
    return [Sized(f"{r['case']} / {r['config']}", r.get("lines"), r.get("seconds"))
            for r in rows if "error" not in r]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--configs", nargs="*", default=None, choices=CONFIGS)
    parser.add_argument("--tree", default=None, help="another checkout, for the `tree` config")
    parser.add_argument("--parallel", type=int, default=None, help="default: half the cores")
    parser.add_argument("--max-time", type=float, default=None,
                        help="a limit per run (default: none, each runs to its fixed point)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--cases", nargs="*", default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", nargs=2, metavar=("CASE", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--probed", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.parallel is None:
        options.parallel = max(2, min(8, (os.cpu_count() or 2) // 2))
    cases, skipped = cases_for(options.device)
    if options.one:
        name, config = options.one
        [case] = [c for c in cases if c.name == name]
        specs, named_specs, named_values = pickle.loads(options.probed.read_bytes())
        case = replace(case, specs=specs, named_specs=named_specs, named_values=named_values)
        print(json.dumps(run_one(case, config, options)))
        return
    options.configs = options.configs or [c for c in CONFIGS if c != "tree" or options.tree]
    if options.cases:
        cases = [c for c in cases if c.name in options.cases]
    out = options.out or ROOT / "benchmarks" / "results" / f"source-speed-{options.device}.md"
    options.partial = out.with_suffix(".partial.jsonl")
    options.partial.unlink(missing_ok=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(options.jobs) as pool:
        rows = [row for rows in pool.map(lambda c: bench_case(c, options), cases) for row in rows]
    text = report(rows, skipped, options, time.perf_counter() - started)
    previous = sizes(read_previous(out.with_suffix(".json")) or [])
    text += "\n".join(trend_lines(previous, sizes(rows), unit="lines")) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    (out.with_suffix(".json")).write_text(json.dumps(rows, indent=1))
    print(out)


if __name__ == "__main__":
    main()
