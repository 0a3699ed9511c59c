"""Benchmark `reprocut record --nan`: overhead on healthy runs, and time to the producing op.

    python benchmarks/bench_nan.py [--device cuda] [--repeats 2] [--out benchmarks/results]
        [--only overhead|origin]

Overhead: the training loop's own time (LOOP_SECONDS, warm-up excluded) of the healthy
GPU-bound and launch-bound workloads (benchmarks/workloads/), run plain, under
`torch.autograd.set_detect_anomaly(True)`, under `reprocut record` and `reprocut record --nan`,
interleaved in the same run; ratios are over plain.
Time to the producing op: `workloads/nan_late.py` makes a NaN at step --nan-at (>= 100) and
trains on silently; `reprocut record --nan` (the run, stopped 5 steps later, then the rerun to
that step) against a plain run of the script and a run under detect_anomaly, which raises in
backward at the first node that returned NaN. Writes benchmarks/results/nan-<device>.md and .json
(or in --out) with the machine, date and command; a rerun overwrites them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import platform
import re
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_record import device_name, loop_seconds, run, run_meta

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
ANOMALY = (
    "import runpy, sys, torch; torch.autograd.set_detect_anomaly(True); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
WAYS = ("plain", "detect_anomaly", "record", "record_nan", "record_nan_no_snapshots")


def command(way: str, script: Path, args: list[str], workdir: Path) -> list[str]:
    if way == "plain":
        return [sys.executable, str(script), *args]
    if way == "detect_anomaly":
        return [sys.executable, "-c", ANOMALY, str(script), *args]
    record = [sys.executable, "-m", "reprocut", "record", "--root", str(workdir / "rec")]
    if way.startswith("record_nan"):
        record.append("--nan")
    if way.endswith("no_snapshots"):  # device asserts then localized by a rerun, not replay
        record.append("--no-snapshots")
    return [*record, "--json", str(script), *args]


def overhead(
    workload: str, device: str, repeats: int, workdir: Path, ways: tuple[str, ...] = WAYS
) -> dict[str, float]:
    ways = ("plain", *(w for w in ways if w != "plain"))  # every ratio is over plain
    loops: dict[str, list[float]] = {way: [] for way in ways}
    totals: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(repeats):  # interleaved: drift in the machine hits every way alike
        for way in ways:
            seconds, out, code = run(
                command(way, WORKLOADS / workload, ["--device", device], workdir), cwd=workdir
            )
            assert code == (1 if way.startswith("record") else 0), out[-2000:]  # healthy
            loops[way].append(loop_seconds(out))
            totals[way].append(seconds)
    figures: dict[str, float] = {}
    for way in ways:
        figures[f"{way}_loop_s"] = statistics.median(loops[way])
        figures[f"{way}_total_s"] = statistics.median(totals[way])
        figures[f"{way}_loop_ratio"] = figures[f"{way}_loop_s"] / figures["plain_loop_s"]
        figures[f"{way}_total_ratio"] = figures[f"{way}_total_s"] / figures["plain_total_s"]
    return figures


def time_to_origin(device: str, nan_at: int, workdir: Path) -> dict[str, object]:
    script = WORKLOADS / "nan_late.py"
    args = ["--nan-at", str(nan_at), "--device", device]
    results: dict[str, object] = {"nan_at": nan_at}
    results["plain_s"], _, _ = run(command("plain", script, args, workdir))
    seconds, out, _ = run(command("detect_anomaly", script, args, workdir))
    named = re.search(r"Function '(\w+)' returned nan values", out)
    at_step = re.findall(r"^(\d+) ", out, flags=re.MULTILINE)
    results["anomaly_s"] = seconds
    results["anomaly_named"] = named.group(1) if named else None
    results["anomaly_last_step_printed"] = int(at_step[-1]) if at_step else None
    seconds, out, _ = run(command("record_nan", script, args, workdir), cwd=workdir)
    report: dict[str, object] = {}
    with contextlib.suppress(ValueError):
        report = json.loads(out[out.index("{") : out.rindex("}") + 1])
    origin = report.get("nonfinite") or {}
    results["record_nan_s"] = seconds
    results["record_nan_op"] = report.get("op")
    results["record_nan_step"] = report.get("step")
    results["record_nan_line"] = (origin.get("source") or {}).get("text")
    meta = run_meta(report)
    results["record_nan_script_s"] = meta.get("seconds")
    results["record_nan_localize_s"] = meta.get("localize_seconds")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--nan-at", type=int, default=150)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--only", choices=("overhead", "origin"), help="one part, printed only")
    parser.add_argument(
        "--workloads", nargs="+", default=["gpu_bound", "launch_bound"], help="overhead workloads"
    )
    parser.add_argument(
        "--ways", nargs="+", choices=WAYS, default=list(WAYS), help="overhead ways (plain always)"
    )
    options = parser.parse_args()
    import torch

    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if options.only != "origin":
            for name in options.workloads:
                figures[name] = overhead(
                    f"{name}.py", options.device, options.repeats, workdir, tuple(options.ways)
                )
        if options.only != "overhead":
            figures["origin"] = time_to_origin(options.device, options.nan_at, workdir)
    if options.only:
        print(json.dumps(figures, indent=2))
        return
    today = dt.date.today().isoformat()
    meta = {
        "date": today,
        "device": options.device,
        "device_name": device_name(options.device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(["python benchmarks/bench_nan.py", *sys.argv[1:]]),
    }
    options.out.mkdir(parents=True, exist_ok=True)
    stem = options.out / f"nan-{options.device}"
    stem.with_suffix(".json").write_text(json.dumps({**meta, **figures}, indent=2))
    stem.with_suffix(".md").write_text(render(meta, figures))
    print(render(meta, figures))


def render(meta: dict[str, str], figures: dict[str, dict]) -> str:
    lines = [
        f"# reprocut record --nan benchmark: {meta['device_name']} ({meta['device']})",
        "",
        f"Date {meta['date']}, torch {meta['torch']}, Python {meta['python']}. "
        f"Command: `{meta.get('command', '?')}`. Medians; loop = "
        "the training loop's own time (warm-up excluded), ratio over plain; total = process.",
        "",
        "## Overhead on healthy runs",
        "",
        "| workload | way | loop s | loop ratio | total s | total ratio |",
        "|---|---|---|---|---|---|",
    ]
    for name in (n for n in figures if n != "origin"):
        f = figures[name]
        for way in (w for w in WAYS if f"{w}_loop_s" in f):
            lines.append(
                f"| {name} | {way} | {f[f'{way}_loop_s']:.3f} | {f[f'{way}_loop_ratio']:.2f}x "
                f"| {f[f'{way}_total_s']:.2f} | {f[f'{way}_total_ratio']:.2f}x |"
            )
    o = figures["origin"]
    lines += [
        "",
        f"## Time to the producing op (NaN born at step {o['nan_at']})",
        "",
        "| way | seconds | names |",
        "|---|---|---|",
        f"| plain run (trains on with NaN, for scale) | {o['plain_s']:.2f} | nothing |",
        f"| detect_anomaly run | {o['anomaly_s']:.2f} | {o['anomaly_named']} (backward node; "
        f"last step printed {o['anomaly_last_step_printed']}) |",
        f"| reprocut record --nan | {o['record_nan_s']:.2f} | {o['record_nan_op']} at step "
        f"{o['record_nan_step']}: `{o['record_nan_line']}` (run {o['record_nan_script_s']} s, "
        f"rerun {o['record_nan_localize_s']} s) |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
