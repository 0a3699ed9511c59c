"""The floor under `reprocut record`'s overhead: what merely seeing every aten op costs.

One process, the launch-bound workload's model (a small MLP: hundreds of tiny kernels a step),
rounds alternated so drift hits every way alike; the best round of each way is reported:

- plain: no observer;
- bare dispatch mode: a TorchDispatchMode that only calls the op (any Python per-op recorder
  costs at least this);
- profiler shapes: torch.profiler with record_shapes (a C++ observer: names, shapes, dtypes);
- reprocut recorder, every op: the Recorder with a full trace (`reprocut record --full-trace`);
- reprocut recorder: the Recorder as `reprocut record` runs it on a GPU: every op in steps 0-2
  and at powers of two, the asserting ops (tripwire kernels) in the light steps between. Each
  round starts a new recorder at step 0, so 7 of a round's 50 steps record every op.

    python benchmarks/dispatch_overhead.py [--device cuda] [--rounds 5] [--out FILE.md]

Writes benchmarks/results/dispatch-overhead-<device>.md (or --out) with the machine, date and
command; a rerun overwrites it.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class BareMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def make_step(device: str) -> Callable[[], None]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        x = torch.randn(32, 64, device=device)
        y = torch.randint(0, 10, (32,), device=device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


@contextmanager
def recorder(run_dir: Path, light_steps: bool) -> Iterator[None]:
    from reprocut.record.inside.recorder import Recorder, RecorderConfig

    run_dir = Path(tempfile.mkdtemp(dir=run_dir))
    rec = Recorder(RecorderConfig(run_dir=run_dir, light_steps=light_steps))
    rec.__enter__()
    try:
        yield
    finally:
        rec.close()


def seconds_per_step(step: Callable[[], None], device: str, steps: int) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    step = make_step(args.device)
    with tempfile.TemporaryDirectory(prefix="reprocut-overhead-") as tmp:
        ways: dict[str, Callable[[], AbstractContextManager[object]]] = {
            "plain": nullcontext,
            "bare dispatch mode": BareMode,
            "profiler shapes": lambda: torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
            ),
            "reprocut recorder, every op": lambda: recorder(Path(tmp), False),
            "reprocut recorder": lambda: recorder(Path(tmp), True),
        }
        for way in ways.values():  # warm-up: first-use imports and caches
            with way():
                seconds_per_step(step, args.device, 5)
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, way in ways.items():
                with way():
                    took = seconds_per_step(step, args.device, args.steps)
                best[name] = min(best.get(name, float("inf")), took)
    plain = best["plain"]
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    lines = [
        f"# What seeing every aten op costs ({args.device})",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {device or platform.machine()}, "
        f"torch {torch.__version__}, Python {platform.python_version()}; launch-bound MLP, best of "
        f"{args.rounds} rounds of {args.steps} steps. Command: "
        f"`{' '.join(['python benchmarks/dispatch_overhead.py', *sys.argv[1:]])}`.",
        "",
        "| way | ms per step | vs plain |",
        "|---|---|---|",
        *(f"| {n} | {s * 1e3:.2f} | {s / plain:.2f}x |" for n, s in best.items()),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or ROOT / "benchmarks" / "results" / f"dispatch-overhead-{args.device}.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
