"""Where `reprocut record` spends its time on a launch-bound loop: per-step cost, and a profile.

    python benchmarks/profile_record.py [--device cuda] [--steps 300] [--rounds 3] [--out FILE]
        [--base DIR]   # also time another checkout's reprocut (DIR holds its package), A/B
        [--light-cpu]  # on a CPU machine: the GPU's light-step Python path (see below)
        [--free-norms]  # with --light-cpu: --nan's norms cost the host nothing (see below)

Runs the launch-bound workload's model (benchmarks/workloads/launch_bound.py: a small MLP, Adam)
in this process under the Recorder as the child builds it (light steps on GPU runs), plain,
recorded, and recorded with `--nan`, each in a fresh process, `rounds` times interleaved; the
best and median ms per step of each. Then one profiled run of each recorded way: reprocut's own functions by
time spent in them and by cumulative time. The profile inflates Python's share; the per-step
figures come from the unprofiled runs. Writes markdown (with machine, date and command) to --out,
by default benchmarks/results/profile-record-<device>.md (profile-record-light-cpu.md with
--light-cpu); a rerun overwrites it.

`--light-cpu` runs on the CPU what a GPU run does after its first steps: light steps (only the
asserting ops seen, by the tripwire), the function mode off, foreach Adam, and snapshots taken
as for CUDA tensors (`_touches_cuda` true, public calls captured as on a GPU; the copies are CPU
clones). Times are process CPU seconds (`time.process_time`): the machine may be shared.
On CPU, `--nan`'s cost is mostly the CPU computing the norms (one `linalg_vector_norm` per
tensor), which on a GPU is a launch; `--free-norms` makes `torch._foreach_norm` answer zeros
without computing, so what is left is the host work the GPU shares (the calls, stacking, copies).
"""

from __future__ import annotations

import argparse
import contextlib
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


def workload(
    device: str,
    steps: int,
    way: str,
    profile: Path | None,
    light_cpu: bool = False,
    free_norms: bool = False,
) -> float:
    """Seconds per step of the workload's loop (after 20 warm-up steps), under `way`."""
    import torch

    if free_norms:  # the norms' values are never non-finite here: zeros, without the arithmetic
        zero = torch.zeros(())
        torch._foreach_norm = lambda tensors, ord=2, **kwargs: [zero] * len(tensors)

    from reprocut.record.inside.recorder import Recorder, RecorderConfig

    if light_cpu:  # snapshots and public captures as for CUDA tensors
        import importlib

        import reprocut.record.inside.ops as ops_module

        ops_module._touches_cuda = lambda args, kwargs: True
        for name in (
            "reprocut.record.inside.recorder",
            "reprocut.record.inside.public",
        ):  # older checkouts
            with contextlib.suppress(ImportError):
                module = importlib.import_module(name)
                if hasattr(module, "on_cpu"):
                    module.on_cpu = lambda args, kwargs: False  # type: ignore[attr-defined]

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True if light_cpu else None)

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
        config = RecorderConfig(run_dir=run_dir, nan=way == "nan", light_steps=light_cpu or None)
        recorder = Recorder(config)
        recorder.__enter__()
        if light_cpu:  # on a GPU the function modes are off after step 0 (no raise watch)
            recorder._function_mode.set(False)
            recorder._function_mode.set = lambda active: None  # type: ignore[method-assign]
            recorder._raise_watch.set = lambda active: None  # type: ignore[method-assign]
    clock = time.process_time if light_cpu else time.perf_counter
    try:
        loop(20)
        synchronize()
        start = clock()
        if profile is not None:
            cProfile.runctx("loop(steps)", globals(), {"loop": loop, "steps": steps}, str(profile))
        else:
            loop(steps)
        synchronize()
        return (clock() - start) / steps
    finally:
        if recorder is not None:
            recorder.close()


# reprocut's functions and the torch calls they make per step (CUDA's Python wrappers too)
SHOWN = r"reprocut|_foreach_norm|cudaHost|Event|copy_|\bto\b|torch\._C\.|stack|cuda/streams|pin"


def top(profile: Path, key: str, count: int = 18) -> str:
    out = io.StringIO()
    stats = pstats.Stats(str(profile), stream=out)
    stats.sort_stats(key).print_stats(SHOWN, count)
    return _trimmed(out.getvalue(), "ncalls")


def callees(profile: Path, pattern: str) -> str:
    """What the functions matching `pattern` called, and the time each took (an `unrecorded`
    block's exit cost 0.15 s over 900 calls in a GPU profile, with nothing slow inside it)."""
    out = io.StringIO()
    pstats.Stats(str(profile), stream=out).print_callees(pattern)
    return _trimmed(out.getvalue(), "Function")


def _trimmed(text: str, header: str) -> str:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith(header)), 0)
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
    parser.add_argument(
        "--light-cpu",
        action="store_true",
        help="on CPU, the GPU's light-step path (light steps, no function mode, snapshots)",
    )
    parser.add_argument(
        "--free-norms",
        action="store_true",
        help="with --light-cpu: torch._foreach_norm answers zeros (a launch on a GPU, not work)",
    )
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        seconds = workload(
            args.device, args.steps, args.child, args.profile, args.light_cpu, args.free_norms
        )
        print(f"STEP_SECONDS {seconds:.6f}")
        return
    base = [sys.executable, __file__, "--device", args.device, "--steps", str(args.steps)]
    if args.light_cpu:
        base.append("--light-cpu")
    if args.free_norms:
        base.append("--free-norms")

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
    how = ", light steps emulated on CPU (--light-cpu), CPU seconds" if args.light_cpu else ""
    if args.free_norms:
        how += ", --nan's norms free (--free-norms)"
    lines = [
        f"# Where `reprocut record` spends its time: launch-bound loop ({args.device})",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {device_label(args.device)}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs; {args.steps} steps, "
        f"{args.rounds} rounds interleaved{how}. Command: "
        f"`{' '.join(['python benchmarks/profile_record.py', *sys.argv[1:]])}`.",
        "",
        "| way | best ms per step | vs plain | reprocut's own ms per step | median ms per step |",
        "|---|---|---|---|---|",
    ]
    for name, values in seconds.items():
        best = min(values)
        lines.append(
            f"| {name} | {best * 1e3:.3f} | {best / plain:.2f}x | {(best - plain) * 1e3:.3f} | "
            f"{statistics.median(values) * 1e3:.3f} |"
        )
    with tempfile.TemporaryDirectory() as tmp:
        for way in WAYS[1:]:
            profile = Path(tmp) / f"{way}.prof"
            child(way, profile)
            for key in ("tottime", "cumulative"):
                lines += ["", f"## `{way}`: by {key}", "", "```", top(profile, key), "```"]
            if way == "nan":
                pattern = r"nonfinite.py.*(__enter__|__exit__|_queue)"
                lines += ["", "## `nan`: what `unrecorded` and `_queue` call", ""]
                lines += ["```", callees(profile, pattern), "```"]
    text = "\n".join(lines) + "\n"
    print(text)
    name = "profile-record-light-cpu" if args.light_cpu else f"profile-record-{args.device}"
    out = args.out or Path(__file__).resolve().parent / "results" / f"{name}.md"
    out.write_text(text)


def label(way: str, path: Path | None) -> str:
    return way if path is None else f"{way} ({path})"


def device_label(device: str) -> str:
    import torch

    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "CPU"
    return f"{name}, torch {torch.__version__}"


if __name__ == "__main__":
    main()
