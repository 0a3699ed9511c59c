"""Benchmark `reprocut record`: its cost against a plain run of the same script.

    python benchmarks/bench_record.py [--device cpu] [--repeats 3] [--full-trace-repeats 1]
    python benchmarks/bench_record.py --device cuda [--repeats 3] [--only overhead|culprit]
        [--workload launch_bound] [--out benchmarks/results]

CPU (the default): `workloads/cpu_train_eval.py`, a small model trained for 3,000 iterations and
evaluated over 4,000 batches that then fails in generate(), run plainly and under `reprocut
record`, interleaved, --repeats times each; medians of wall and CPU seconds (the machine may be
shared), and in each recorded run whether record named the right op, line and place (the
workload's `# reprocut: culprit` line, after the training loop). `record --full-trace` (every op
of every step) runs --full-trace-repeats times for scale.

CUDA: overhead on healthy runs, the training loop's own wall time (printed by the workload as
LOOP_SECONDS, warm-up excluded) under `reprocut record` over a plain `python` run, total process
time alongside; and time to culprit: a script failing at step >= 100, `reprocut record` (one
pass + localization) against the plain `CUDA_LAUNCH_BLOCKING=1 python train.py` rerun a user
would do by hand. --only / --workload run a part (printed, not written to --out).

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
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
TIMEOUT = 600
CPU_WORKLOAD = WORKLOADS / "cpu_train_eval.py"
CPU_ITERATIONS = 3000  # the workload's default --iters: the steps record must count
MARKER = "# reprocut: culprit"


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


def timed(command: list[str], cwd: Path | None = None) -> tuple[float, float, str, int]:
    """(wall seconds, CPU seconds of the process and its children, output, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, out, code = run(command, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, out, code


def marker_line(script: Path) -> int:
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if MARKER in line)


def named_right(report: dict[str, object], script: Path) -> dict[str, object]:
    """What a `record --json` report named, and whether it is the workload's failure: the
    position embedding's lookup at the marked line, in generate(), after the training loop."""
    source = report.get("source") or {}
    after = report.get("after_loop") or {}
    assert isinstance(source, dict) and isinstance(after, dict)
    found = {
        "op": report.get("op"),
        "line": source.get("line"),
        "after_loop": after.get("text"),
        "localization": report.get("localization"),
    }
    found["right"] = (
        found["op"] == "aten::embedding"
        and source.get("file") == str(script)
        and found["line"] == marker_line(script)
        and after.get("steps") == CPU_ITERATIONS
        and after.get("function") == "generate"
    )
    return found


def cpu_record(repeats: int, full_trace_repeats: int, workdir: Path) -> dict[str, object]:
    """Plain runs and `reprocut record` runs of the CPU workload, interleaved (the machine's
    load drifts), then `record --full-trace` runs for scale."""
    script = CPU_WORKLOAD
    plain: list[tuple[float, float]] = []
    ways: dict[str, list[tuple[float, float]]] = {"record": [], "record_full_trace": []}
    found: dict[str, list[dict[str, object]]] = {"record": [], "record_full_trace": []}

    def record(way: str, flags: list[str]) -> None:
        root = workdir / "rec"
        command = [sys.executable, "-m", "reprocut", "record", "--json", "--quiet"]
        seconds, cpu, out, code = timed([*command, "--root", str(root), *flags, str(script)])
        assert code == 0, out[-2000:]  # localized
        ways[way].append((seconds, cpu))
        found[way].append(
            named_right(json.loads(out[out.index("{") : out.rindex("}") + 1]), script)
        )

    for _ in range(repeats):
        seconds, cpu, out, code = timed([sys.executable, str(script)])
        assert code == 1 and "IndexError" in out, out[-2000:]
        plain.append((seconds, cpu))
        record("record", [])
    for _ in range(full_trace_repeats):
        record("record_full_trace", ["--full-trace"])
    figures: dict[str, object] = {"workload": script.name, "repeats": repeats}
    figures.update(_medians("plain", plain))
    for way, runs in ways.items():
        if not runs:
            continue
        figures.update(_medians(way, runs))
        figures[f"{way}_ratio"] = figures[f"{way}_s"] / figures["plain_s"]
        figures[f"{way}_cpu_ratio"] = figures[f"{way}_cpu_s"] / figures["plain_cpu_s"]
        figures[f"{way}_found"] = found[way]
    return figures


def _medians(way: str, runs: list[tuple[float, float]]) -> dict[str, object]:
    return {
        f"{way}_s": statistics.median(wall for wall, _ in runs),
        f"{way}_cpu_s": statistics.median(cpu for _, cpu in runs),
        f"{way}_runs_s": [round(wall, 2) for wall, _ in runs],
    }


def machine() -> str:
    """The CPU's model name, core count and load (the machine may be shared)."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, load average {load} at the start"


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
    parser.add_argument(
        "--full-trace-repeats", type=int, default=1, help="CPU: runs of `record --full-trace`"
    )
    parser.add_argument("--fail-at", type=int, default=150)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--only", choices=("overhead", "culprit"), help="run one part only")
    parser.add_argument("--workload", choices=("gpu_bound", "launch_bound"), help="one only")
    options = parser.parse_args()
    if options.only or options.workload:
        print(json.dumps(part(options), indent=2))
        return
    import torch

    if options.device == "cpu":
        cpu_main(options, torch.__version__)
        return
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


def cpu_main(options: argparse.Namespace, torch_version: str) -> None:
    """The CPU workload's figures, written to record-cpu.md and .json."""
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": "cpu",
        "device_name": machine(),
        "torch": torch_version,
        "python": platform.python_version(),
        "commit": _commit(),
        "command": " ".join(["python benchmarks/bench_record.py", *sys.argv[1:]]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        figures = cpu_record(options.repeats, options.full_trace_repeats, Path(tmp))
    options.out.mkdir(parents=True, exist_ok=True)
    stem = options.out / "record-cpu"
    stem.with_suffix(".json").write_text(json.dumps({**meta, **figures}, indent=2))
    text = render_cpu(meta, figures)
    stem.with_suffix(".md").write_text(text)
    print(text)


def _commit() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=HERE,
            timeout=30,
        )
        return done.stdout.strip()
    return "?"


def render_cpu(meta: dict[str, str], f: dict[str, object]) -> str:
    repeats = f["repeats"]
    lines = [
        "# reprocut record benchmark: CPU",
        "",
        f"Machine: {meta['device_name']}. Date {meta['date']}, torch {meta['torch']}, "
        f"Python {meta['python']}, commit `{meta['commit']}`. Command: `{meta['command']}`.",
        "",
        f"Workload: `benchmarks/workloads/{f['workload']}`, a small character-level model "
        f"trained for {CPU_ITERATIONS:,} iterations and evaluated over 4,000 batches, which then "
        "fails in generate() (the position embedding is asked for a position past its table). "
        f"Plain runs and `reprocut record` runs alternate, {repeats} of each; the figures are "
        "medians, wall seconds of the whole command (reprocut's own start, the script, the "
        "localization and the report) and CPU seconds of all its processes.",
        "",
        "| way | runs | wall s (median) | each run, s | vs plain | CPU s (median) | CPU vs plain |",
        "|---|---|---|---|---|---|---|",
        f"| `python cpu_train_eval.py` | {repeats} | {f['plain_s']:.2f} | "
        f"{', '.join(map(str, f['plain_runs_s']))} | 1.00x | {f['plain_cpu_s']:.2f} | 1.00x |",
    ]
    labels = {
        "record": "`reprocut record cpu_train_eval.py`",
        "record_full_trace": "`reprocut record --full-trace` (every op of every step)",
    }
    for way, label in labels.items():
        if f"{way}_s" not in f:
            continue
        runs = f[f"{way}_runs_s"]
        ratio = f"{f[f'{way}_ratio']:.2f}x"
        if way == "record":
            ratio = f"**{ratio}**"
        lines.append(
            f"| {label} | {len(runs)} | {f[f'{way}_s']:.2f} | {', '.join(map(str, runs))} | "
            f"{ratio} | {f[f'{way}_cpu_s']:.2f} | {f[f'{way}_cpu_ratio']:.2f}x |"
        )
    lines += [
        "",
        "What the recorded runs named (right: the marked line's `aten::embedding`, in "
        f"generate(), after the training loop's {CPU_ITERATIONS:,} steps):",
        "",
    ]
    for way, label in labels.items():
        named: dict[str, int] = {}
        for found in f.get(f"{way}_found", []):
            said = (
                f"{found['op']} at line {found['line']}, {found['after_loop']}, localized "
                f"{found['localization']}: {'right' if found['right'] else 'WRONG'}"
            )
            named[said] = named.get(said, 0) + 1
        for said, count in named.items():
            lines.append(f"- {label}, {count} of {len(f[f'{way}_found'])} runs: {said}")
    lines += [
        "",
        "The wall figures include reprocut's own process (its start, the torch import it makes "
        "while the script runs, the report), which runs beside the script on the second core; "
        "the CPU figures count it whole. The machine is shared with other work: compare the "
        "runs of one table, not tables of different days.",
    ]
    lines.append("")
    return "\n".join(lines)


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
