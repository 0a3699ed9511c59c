"""Benchmark `reprocut record`: overhead on healthy runs, and time to culprit on a late failure.

    python benchmarks/bench_record.py [--device cuda] [--repeats 3] [--out benchmarks/results]
        [--only overhead|culprit] [--workload launch_bound]

--only / --workload run a part (printed, not written to --out): for quick iteration.

Overhead: the training loop's own wall time (printed by the workload as LOOP_SECONDS, warm-up
excluded) under `reprocut record` over a plain `python` run; total process time alongside.
Time to culprit: a script failing at step >= 100, `reprocut record` (one pass + localization)
against the plain `CUDA_LAUNCH_BLOCKING=1 python train.py` rerun a user would do by hand.
Writes benchmarks/results/record-<device>.md and .json (or in --out) with the machine, date and
command; a rerun overwrites them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
TIMEOUT = 600


def run(
    command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, str, int]:
    start = time.perf_counter()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    return time.perf_counter() - start, done.stdout + done.stderr, done.returncode


def loop_seconds(output: str) -> float:
    match = re.search(r"LOOP_SECONDS ([\d.]+)", output)
    if not match:
        raise RuntimeError(f"workload printed no LOOP_SECONDS:\n{output[-2000:]}")
    return float(match.group(1))


def overhead(workload: str, device: str, repeats: int, workdir: Path) -> dict[str, float]:
    script = str(WORKLOADS / workload)
    plain_loop, plain_total, rec_loop, rec_total = [], [], [], []
    for _ in range(repeats):
        seconds, out, code = run([sys.executable, script, "--device", device])
        assert code == 0, out[-2000:]
        plain_loop.append(loop_seconds(out))
        plain_total.append(seconds)
        seconds, out, code = run(
            [
                sys.executable,
                "-m",
                "reprocut",
                "record",
                "--root",
                str(workdir / "rec"),
                script,
                "--device",
                device,
            ],
            cwd=workdir,
        )
        assert code == 1, out[-2000:]  # healthy: "nothing to reproduce"
        rec_loop.append(loop_seconds(out))
        rec_total.append(seconds)
    return {
        "plain_loop_s": statistics.median(plain_loop),
        "record_loop_s": statistics.median(rec_loop),
        "loop_ratio": statistics.median(rec_loop) / statistics.median(plain_loop),
        "plain_total_s": statistics.median(plain_total),
        "record_total_s": statistics.median(rec_total),
        "total_ratio": statistics.median(rec_total) / statistics.median(plain_total),
    }


def time_to_culprit(device: str, fail_at: int, workdir: Path) -> dict[str, object]:
    script = str(WORKLOADS / "fails_late.py")
    args = ["--fail-at", str(fail_at), "--device", device]
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    plain_first, _, _ = run([sys.executable, script, *args])
    blocking, _, _ = run([sys.executable, script, *args], env=env)
    results: dict[str, object] = {
        "fail_at": fail_at,
        "plain_run_s": plain_first,
        "blocking_rerun_s": blocking,
    }
    for label, flags in (("record_snapshots", []), ("record_rerun", ["--no-snapshots"])):
        seconds, out, _code = run(
            [
                sys.executable,
                "-m",
                "reprocut",
                "record",
                "--json",
                "--quiet",
                "--root",
                str(workdir / "rec"),
                *flags,
                script,
                *args,
            ],
            cwd=workdir,
        )
        report = {}
        with contextlib.suppress(ValueError):
            report = json.loads(out[: out.rindex("}") + 1][out.index("{") :])
        results[f"{label}_s"] = seconds
        results[f"{label}_ratio"] = seconds / blocking
        results[f"{label}_op"] = report.get("op")
        results[f"{label}_step"] = report.get("step")
        results[f"{label}_localization"] = report.get("localization")
        meta = run_meta(report)
        results[f"{label}_script_s"] = meta.get("seconds")  # the recorded run of the script
        results[f"{label}_localize_s"] = meta.get("localize_seconds")  # then finding the op
    return results


def run_meta(report: dict[str, object]) -> dict[str, object]:
    """The meta.json of the run a `record --json` report names ({} if it cannot be read)."""
    with contextlib.suppress(KeyError, OSError, ValueError):
        return json.loads((Path(str(report["run_dir"])) / "meta.json").read_text())
    return {}


def device_name(device: str) -> str:
    if device != "cuda":
        return platform.processor() or platform.machine()
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fail-at", type=int, default=150)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--only", choices=("overhead", "culprit"), help="run one part only")
    parser.add_argument("--workload", choices=("gpu_bound", "launch_bound"), help="one only")
    options = parser.parse_args()
    if options.only or options.workload:
        print(json.dumps(part(options), indent=2))
        return
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        figures = {
            "gpu_bound": overhead("gpu_bound.py", options.device, options.repeats, workdir),
            "launch_bound": overhead("launch_bound.py", options.device, options.repeats, workdir),
            "time_to_culprit": time_to_culprit(options.device, options.fail_at, workdir),
        }
    today = dt.date.today().isoformat()
    meta = {
        "date": today,
        "device": options.device,
        "device_name": device_name(options.device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(["python benchmarks/bench_record.py", *sys.argv[1:]]),
    }
    options.out.mkdir(parents=True, exist_ok=True)
    stem = options.out / f"record-{options.device}"
    stem.with_suffix(".json").write_text(json.dumps({**meta, **figures}, indent=2))
    stem.with_suffix(".md").write_text(render(meta, figures))
    print(render(meta, figures))


def part(options: argparse.Namespace) -> dict[str, object]:
    """The figures of one part (--only, --workload), for iterating on one number."""
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if options.only != "culprit":
            for name in [options.workload] if options.workload else ["gpu_bound", "launch_bound"]:
                figures[name] = overhead(f"{name}.py", options.device, options.repeats, workdir)
        if options.only == "culprit":
            figures["time_to_culprit"] = time_to_culprit(options.device, options.fail_at, workdir)
    return figures


def render(meta: dict[str, str], figures: dict[str, dict]) -> str:
    lines = [
        f"# reprocut record benchmark: {meta['device_name']} ({meta['device']})",
        "",
        f"Date {meta['date']}, torch {meta['torch']}, Python {meta['python']}. "
        f"Command: `{meta.get('command', '?')}`. "
        "Medians; loop = the training loop's own time (warm-up excluded); total = whole process.",
        "",
        "## Overhead on healthy runs",
        "",
        "| workload | plain loop s | record loop s | loop ratio | plain total s | record total s | total ratio | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, target in (("gpu_bound", "≤ 1.15x"), ("launch_bound", "≤ 2x")):
        f = figures[name]
        lines.append(
            f"| {name} | {f['plain_loop_s']:.3f} | {f['record_loop_s']:.3f} | {f['loop_ratio']:.2f}x "
            f"| {f['plain_total_s']:.2f} | {f['record_total_s']:.2f} | {f['total_ratio']:.2f}x | {target} |"
        )
    t = figures["time_to_culprit"]
    lines += [
        "",
        f"## Time to culprit (failure at step {t['fail_at']})",
        "",
        "| way | seconds | vs blocking rerun | op found | step | localization | script run s | localize s |",
        "|---|---|---|---|---|---|---|---|",
        f"| plain run (the failure, for scale) | {t['plain_run_s']:.2f} | | | | | | |",
        f"| `CUDA_LAUNCH_BLOCKING=1 python train.py` | {t['blocking_rerun_s']:.2f} | 1.00x | (traceback) | | | | |",
    ]
    for label in ("record_snapshots", "record_rerun"):
        lines.append(
            f"| reprocut record{' --no-snapshots' if label == 'record_rerun' else ''} "
            f"| {t[f'{label}_s']:.2f} | {t[f'{label}_ratio']:.2f}x | {t[f'{label}_op']} "
            f"| {t[f'{label}_step']} | {t[f'{label}_localization']} "
            f"| {t.get(f'{label}_script_s') or '·'} | {t.get(f'{label}_localize_s') or '·'} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
