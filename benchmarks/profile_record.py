"""Where `reprocut record` spends its time on a launch-bound loop: per-step cost, and a profile.

    python benchmarks/profile_record.py [--device cuda] [--steps 300] [--rounds 3] [--out FILE]
        [--base DIR]   # also time another checkout's reprocut (DIR holds its package), A/B

Runs the launch-bound workload's model (benchmarks/workloads/launch_bound.py: a small MLP, Adam)
in this process under the Recorder as the child builds it (light steps on GPU runs), plain,
recorded, and recorded with `--nan`, each in a fresh process, `rounds` times interleaved; the
best and median ms per step of each. Then one profiled run of each recorded way: reprocut's own functions by
time spent in them and by cumulative time. The profile inflates Python's share; the per-step
figures come from the unprofiled runs. Writes markdown (with machine and date) to --out.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WAYS = ("plain", "record", "nan")


def workload(device: str, steps: int, way: str, profile: Path | None) -> float:
    """Seconds per step of the workload's loop (after 20 warm-up steps), under `way`."""
    import torch

    from reprocut.record.recorder import Recorder, RecorderConfig

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loop(count: int) -> None:
        for _ in range(count):
            x = torch.randn(32, 64, device=device)
            y = torch.randint(0, 10, (32,), device=device)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    recorder = None
    if way != "plain":
        run_dir = Path(tempfile.mkdtemp(prefix="reprocut-profile-"))
        recorder = Recorder(RecorderConfig(run_dir=run_dir, nan=way == "nan"))
        recorder.__enter__()
    try:
        loop(20)
        synchronize()
        start = time.perf_counter()
        if profile is not None:
            cProfile.runctx("loop(steps)", globals(), {"loop": loop, "steps": steps}, str(profile))
        else:
            loop(steps)
        synchronize()
        return (time.perf_counter() - start) / steps
    finally:
        if recorder is not None:
            recorder.close()


def top(profile: Path, key: str, count: int = 18) -> str:
    out = io.StringIO()
    stats = pstats.Stats(str(profile), stream=out)
    stats.sort_stats(key).print_stats(r"reprocut|_foreach_norm|cudaHost|Event|copy_|\bto\b", count)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    return "\n".join(
        line.replace(str(Path(__file__).resolve().parents[1]), "") for line in lines[start:]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--base", type=Path, help="a folder holding another reprocut package")
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(f"STEP_SECONDS {workload(args.device, args.steps, args.child, args.profile):.6f}")
        return
    base = [sys.executable, __file__, "--device", args.device, "--steps", str(args.steps)]

    def child(way: str, profile: Path | None = None, path: Path | None = None) -> float:
        extra = ["--profile", str(profile)] if profile else []
        env = dict(os.environ)
        if path is not None:  # the other checkout's package first on the path
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
        done = subprocess.run(
            [*base, "--child", way, *extra], capture_output=True, text=True, timeout=300, env=env
        )
        if done.returncode != 0:
            raise SystemExit(f"{way} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        return float(done.stdout.split("STEP_SECONDS")[-1])

    runs = [(way, None) for way in WAYS]
    if args.base is not None:
        runs += [(way, args.base) for way in WAYS[1:]]
    seconds: dict[str, list[float]] = {label(w, p): [] for w, p in runs}
    for _ in range(args.rounds):  # interleaved: drift hits every way alike
        for way, path in runs:
            seconds[label(way, path)].append(child(way, path=path))
    plain = min(seconds["plain"])
    lines = [
        f"# Where `reprocut record` spends its time: launch-bound loop ({args.device})",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {device_label(args.device)}, "
        f"Python {platform.python_version()}; {args.steps} steps, {args.rounds} rounds "
        "interleaved.",
        "",
        "| way | best ms per step | vs plain | median ms per step |",
        "|---|---|---|---|",
    ]
    for name, values in seconds.items():
        best = min(values)
        lines.append(
            f"| {name} | {best * 1e3:.3f} | {best / plain:.2f}x | "
            f"{statistics.median(values) * 1e3:.3f} |"
        )
    with tempfile.TemporaryDirectory() as tmp:
        for way in WAYS[1:]:
            profile = Path(tmp) / f"{way}.prof"
            child(way, profile)
            for key in ("tottime", "cumulative"):
                lines += ["", f"## `{way}`: by {key}", "", "```", top(profile, key), "```"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


def label(way: str, path: Path | None) -> str:
    return way if path is None else f"{way} ({path})"


def device_label(device: str) -> str:
    import torch

    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "CPU"
    return f"{name}, torch {torch.__version__}"


if __name__ == "__main__":
    main()
