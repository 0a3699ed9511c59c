"""What a CUDA check's process costs the machine, part by part, and which settings change it.

A check is a child forked from a parent that imported torch (reprocut's fork server): it
creates a CUDA context, runs the candidate, and exits, often with the context poisoned by a
fault. On the H200 the machine runs about 3 such checks a second however many are in flight
(check-timing-cuda.md), so some step is shared. This forks `--together` children at once,
each timing its context start and its kernel (a faulting read or a clean one), and the parent
timing each child from fork to reaped (its exit and the driver's teardown included), under
each environment of `--env` (e.g. CUDA_DEVICE_MAX_CONNECTIONS=1).

    python benchmarks/cuda_start_probe.py --together 1,8 --count 3 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import cupy  # the parent imports it, as reprocut's preload does
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.forked_children import fork, reap

KERNEL = r"""
extern "C" __global__ void probe_read(const float* x, float* out, long long n, long long shift) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i + shift];
}
"""


def child(write_fd: int, *, fault: bool, env: dict[str, str]) -> None:
    """In the forked child: start CUDA, run the kernel, report the times, exit."""
    os.environ.update(env)
    started = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    context = time.perf_counter()
    kernel_fn = cupy.RawKernel(KERNEL, "probe_read")
    data = torch.zeros(1 << 20, device="cuda")
    out = torch.empty_like(data)
    error = ""
    try:
        shift = cupy.int64((1 << 34) if fault else 0)
        kernel_fn(
            (4096,),
            (256,),
            (cupy.asarray(data), cupy.asarray(out), cupy.int64(data.numel()), shift),
        )
        torch.cuda.synchronize()
    except Exception as exc:  # a fault: its report is the sticky error
        error = type(exc).__name__
    kernel = time.perf_counter()
    os.write(write_fd, json.dumps({"context": context - started, "kernel": kernel - context,
                                   "error": error}).encode())  # fmt: skip
    os._exit(0)


def batch(width: int, fault: bool, env: dict[str, str]) -> tuple[list[dict[str, Any]], float]:
    """`width` children forked at once; each one's own times and its fork-to-reaped time."""
    started = time.perf_counter()
    children = [fork(partial(child, fault=fault, env=env)) for _ in range(width)]
    results = [reap(*forked) for forked in children]
    return results, time.perf_counter() - started


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--together", default="1,8")
    parser.add_argument("--count", type=int, default=3, help="batches per setting")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE[,NAME=VALUE] settings to compare with the default")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    envs: list[dict[str, str]] = [{}]
    for spec in args.env:
        envs.append(dict(item.split("=", 1) for item in spec.split(",")))
    rows = []
    for env in envs:
        for fault in (True, False):
            for width in [int(w) for w in args.together.split(",")]:
                times: list[dict[str, Any]] = []
                wall = 0.0
                for _ in range(args.count):
                    batch_rows, seconds = batch(width, fault, env)
                    times += batch_rows
                    wall += seconds
                row = {
                    "env": env, "fault": fault, "width": width, "per_s": len(times) / wall,
                    "errors": sorted({t.get("error", "?") for t in times}),
                    **{part: summary([t[part] for t in times if part in t])
                       for part in ("context", "kernel", "teardown", "life")},
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda-start-probe.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "| env | fault | at once | checks/s | context | kernel | teardown | life |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        env = ",".join(f"{k}={v}" for k, v in row["env"].items()) or "default"
        lines.append(f"| {env} | {row['fault']} | {row['width']} | {row['per_s']:.2f} | "
                     f"{row['context']} | {row['kernel']} | {row['teardown']} | {row['life']} |")  # fmt: skip
    (args.out / "cuda-start-probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
