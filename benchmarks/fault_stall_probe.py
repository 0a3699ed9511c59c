"""Does one process's memory fault hold up every other process's on the same GPU?

On the H200 (faults-cuda.md at 8257a0d, four CuPy shrinks at once) checks of full-size
candidates, whose kernels fault with millions of threads each, took 7-21 s where they take 1-3
s, and the slow checks of all four shrinks ended within a second of each other, as if something
on the GPU held every faulting process until then. This measures it without reprocut: a
*background* process is started, then, `--delay` seconds later, `--small` children forked from
this process (as reprocut's fork server forks its checks) each start CUDA, launch a small
faulting kernel and time it until the fault is reported, and their exit. `--delay` counts
from when the background is about to launch its kernel (it says so on a pipe). The
backgrounds:

- `none`: the small children alone (the baseline);
- `storm`: a forked child whose kernel faults in every one of `--storm-threads` threads (a
  full-size candidate's fault);
- `train`: a forked child running clean GPU work for `--train-seconds` (a training run beside);
- `storm-fresh`: the storm in a fresh `python` (a plain run of a full-size candidate: no fork,
  CUDA's default settings);
- `storm-memcheck`: the storm in a fresh `python` under compute-sanitizer memcheck (skipped
  without it), as the original's and the repro's memchecks run beside a reduction.

    python benchmarks/fault_stall_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.forked_children import fork, reap

KERNEL = r"""
extern "C" __global__ void probe_read(const float* x, float* out, long long n, long long shift) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i % 1024] = x[i + shift];
}
"""
SMALL_THREADS = 4096 * 256  # the small children's faulting kernel (cuda_start_probe.py's)
SHIFT = 1 << 34  # elements past the input: 64 GiB, unmapped
BACKGROUNDS = ("none", "storm", "train", "storm-fresh", "storm-memcheck")

# the storm as a program of its own (for a fresh python, with or without the sanitizer)
STORM_PROGRAM = r"""
import sys, time, json
import cupy, torch
threads = int(sys.argv[1])
kernel = cupy.RawKernel(sys.argv[2], "probe_read")
data = torch.zeros(1 << 20, device="cuda")
out = torch.empty(1024, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
started = time.perf_counter()
error = ""
try:
    kernel(((threads + 255) // 256,), (256,),
           (cupy.asarray(data), cupy.asarray(out), cupy.int64(threads), cupy.int64(int(sys.argv[3]))))
    torch.cuda.synchronize()
except Exception as exc:
    error = type(exc).__name__
print(json.dumps({"kernel": time.perf_counter() - started, "error": error}), flush=True)
"""


def _fault(threads: int, shift: int, ready: int | None = None) -> tuple[float, str]:
    """Launch the reading kernel over `threads` threads, `shift` elements past the input; its
    seconds until the GPU reports back, and the error's type ('' for none). `ready`: a pipe
    to say on just before the launch."""
    import cupy
    import torch

    kernel = cupy.RawKernel(KERNEL, "probe_read")
    data = torch.zeros(1 << 20, device="cuda")
    out = torch.empty(1024, device="cuda")
    torch.cuda.synchronize()
    _say_ready(ready)
    started = time.perf_counter()
    try:
        kernel(
            ((threads + 255) // 256,),
            (256,),
            (cupy.asarray(data), cupy.asarray(out), cupy.int64(threads), cupy.int64(shift)),
        )
        torch.cuda.synchronize()
    except Exception as exc:  # the fault, reported
        return time.perf_counter() - started, type(exc).__name__
    return time.perf_counter() - started, ""


def _train(seconds: float, ready: int | None = None) -> tuple[float, str]:
    """Clean GPU work (matmuls on 1 GiB of activations) for `seconds`."""
    import torch

    x = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    _say_ready(ready)
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        x = torch.tanh(x @ x / 8192)
        torch.cuda.synchronize()
    return time.perf_counter() - started, ""


def _say_ready(ready: int | None) -> None:
    if ready is not None:
        os.write(ready, b"r")
        os.close(ready)


def _forked(work: Any, write_fd: int) -> None:
    """In a forked child: start CUDA, do `work`, report its times, exit."""
    import torch

    try:
        started = time.perf_counter()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        context = time.perf_counter() - started
        kernel, error = work()
        row = {"context": context, "kernel": kernel, "error": error, "pid": os.getpid()}
    except Exception as exc:  # no GPU, a kernel that did not compile: said in the report
        row = {"error": f"{type(exc).__name__}: {exc}"[:200], "pid": os.getpid()}
    os.write(write_fd, json.dumps(row).encode())
    os._exit(0)


def start_fresh(options: argparse.Namespace, memcheck: bool) -> subprocess.Popen[str] | None:
    """The storm in a fresh python (under memcheck if asked; None: no compute-sanitizer)."""
    command = [sys.executable, "-c", STORM_PROGRAM, str(options.storm_threads), KERNEL, str(SHIFT)]
    if memcheck:
        sanitizer = shutil.which("compute-sanitizer")
        if sanitizer is None:
            return None
        command = [sanitizer, "--tool", "memcheck", "--print-limit", "20", *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def scenario(background: str, options: argparse.Namespace) -> dict[str, Any] | None:
    """One background, then `--small` faulting children `--delay` seconds later."""
    began = time.perf_counter()
    forked = fresh = None
    wait_fd, ready = os.pipe()
    if background == "storm":
        forked = fork(partial(_forked, lambda: _fault(options.storm_threads, SHIFT, ready)))
    elif background == "train":
        forked = fork(partial(_forked, lambda: _train(options.train_seconds, ready)))
    elif background in ("storm-fresh", "storm-memcheck"):
        fresh = start_fresh(options, memcheck=background == "storm-memcheck")
        if fresh is None:
            return None
    os.close(ready)
    if forked is not None:
        os.read(wait_fd, 1)  # about to launch (or gone: b"")
    elif fresh is not None and fresh.stdout is not None:
        while (line := fresh.stdout.readline()) and line.strip() != "ready":
            pass  # the sanitizer's own lines come first; nothing at all if it died
    os.close(wait_fd)
    if background != "none":
        time.sleep(options.delay)
    small = [fork(partial(_forked, lambda: _fault(SMALL_THREADS, SHIFT)))
             for _ in range(options.small)]  # fmt: skip
    rows = [reap(*child) for child in small]
    if forked is not None:
        behind = reap(*forked)
    elif fresh is not None:
        try:
            out, _ = fresh.communicate(timeout=options.fresh_timeout)
        except subprocess.TimeoutExpired:  # memcheck over every faulting thread may take long
            fresh.kill()
            out, _ = fresh.communicate()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        behind = json.loads(lines[-1]) if lines else {"error": f"exit {fresh.returncode}"}
        behind["reported"] = time.perf_counter() - began
    else:
        behind = {}
    return {
        "background": background,
        "behind": behind,
        "small": rows,
        "small_errors": sorted({row.get("error", "?") for row in rows}),
    }


def median_max(rows: list[dict[str, Any]], part: str) -> str:
    """`part` of the rows that have it (a child that died before its report has none)."""
    values = [row[part] for row in rows if part in row]
    return f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "-"


def markdown(results: list[dict[str, Any]], options: argparse.Namespace) -> str:
    lines = [
        f"{options.small} small faulting children, forked {options.delay} s after the background's "
        f"launch; the storm: {options.storm_threads} faulting threads. Seconds, median / max.",
        "",
        "| background | its kernel s | its errors | small: context | small: kernel to report "
        "| small: teardown | small: fork to report |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        small, behind = result["small"], result["behind"]
        kernel = behind.get("kernel")
        lines.append(
            f"| {result['background']} | {'-' if kernel is None else f'{kernel:.2f}'} | "
            f"{behind.get('error') or '-'} | {median_max(small, 'context')} | "
            f"{median_max(small, 'kernel')} | {median_max(small, 'teardown')} | "
            f"{median_max(small, 'reported')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the .md and .json")
    parser.add_argument("--small", type=int, default=4, help="small faulting children (4)")
    parser.add_argument("--delay", type=float, default=0.1,
                        help="seconds from the background's launch to theirs (0.1)")  # fmt: skip
    parser.add_argument("--storm-threads", type=int, default=1 << 28,
                        help="threads of the storm's kernel, each faulting (2**28)")  # fmt: skip
    parser.add_argument("--train-seconds", type=float, default=10.0, help="the clean work (10)")
    parser.add_argument("--fresh-timeout", type=float, default=120.0,
                        help="seconds a fresh storm may run before it is killed (120)")  # fmt: skip
    parser.add_argument("--backgrounds", nargs="+", default=list(BACKGROUNDS), choices=BACKGROUNDS)
    options = parser.parse_args(argv)
    # the parent imports both, as reprocut's fork server does, and starts no CUDA (its
    # children could not then): without a GPU each child's report says so
    import cupy  # noqa: F401
    import torch  # noqa: F401

    results = []
    for background in options.backgrounds:
        result = scenario(background, options)
        if result is None:
            print(f"{background}: skipped (no compute-sanitizer)", flush=True)
            continue
        results.append(result)
        print(json.dumps(result), flush=True)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "fault-stall-probe.json").write_text(json.dumps(results, indent=1))
    text = markdown(results, options)
    (options.out / "fault-stall-probe.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
