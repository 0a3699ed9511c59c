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

The first run on an H100 (2026-12-05) found no stall behind any of these: the small children
took 1.2-1.9 s whatever ran. But they ran only in the background's first second and were never
beside a real case. `--watch` forks one small faulting child after another (each reaped before
the next) for the background's whole life and 2 s after, and the backgrounds are then a real
corpus case's `train.py` (`--case`, default cuda_cupy_contiguous_pe: 1 GiB tensors, its kernel
faulting over millions of threads) run the ways a shrink runs it beside its checks:

- `case-plain`: a plain `python train.py` (the plain runs of verification);
- `case-memcheck`: under compute-sanitizer memcheck with reprocut's options (`--padding`, the
  kernel filter, `PYTORCH_NO_CUDA_MEMORY_CACHING=1`), as the original's memcheck runs;
- `case-memcheck-killed`: the same, its process group killed `--kill-after` seconds in, as a
  memcheck that a newer candidate makes moot is cancelled;
- `storm-memcheck`: the storm under memcheck, watched to its end.

A window of children much slower than the `none` baseline, and where it falls in the
background's life (its start, its kernel, its end or kill), says what holds them.

    python benchmarks/fault_stall_probe.py --out DIR
    python benchmarks/fault_stall_probe.py --watch --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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
WATCHED = ("none", "case-plain", "case-memcheck", "case-memcheck-killed", "storm-memcheck")
CASE = Path(__file__).resolve().parent.parent / "corpus" / "cuda_cupy_contiguous_pe"

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


def start_watched(background: str, options: argparse.Namespace) -> subprocess.Popen[str] | None:
    """A watched background's process in a session of its own (None: no compute-sanitizer)."""
    from reprocut.check.memcheck_process import PADDING, PRINT_LIMIT, kernel_options

    if background == "storm-memcheck":
        return start_fresh(options, memcheck=True)
    command = [sys.executable, "train.py"]
    env = dict(os.environ)
    if background.startswith("case-memcheck"):
        sanitizer = shutil.which("compute-sanitizer")
        if sanitizer is None:
            return None
        command = [sanitizer, "--tool", "memcheck", "--print-limit", str(PRINT_LIMIT),
                   "--padding", str(PADDING), *kernel_options(options.kernel), *command]  # fmt: skip
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return subprocess.Popen(command, cwd=options.case, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip


def watch(background: str, options: argparse.Namespace) -> dict[str, Any] | None:
    """Small faulting children one after another through `background`'s life and 2 s after;
    each row's `at`: seconds from the background's start to the child's fork."""
    began = time.perf_counter()
    process = None if background == "none" else start_watched(background, options)
    if background != "none" and process is None:
        return None
    # a killed background's kill, else the time it may run (`--fresh-timeout`)
    deadline = options.fresh_timeout
    if background.endswith("killed"):
        deadline = min(deadline, options.kill_after)
    ended = killed = None
    rows = []
    while True:
        now = time.perf_counter() - began
        if process is None:
            if now > options.baseline_seconds:
                break
        elif ended is None and process.poll() is not None:
            ended = now
        elif ended is not None and now > ended + 2.0:
            break
        if process is not None and ended is None and killed is None and now > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            killed = now
        child = fork(partial(_forked, lambda: _fault(SMALL_THREADS, SHIFT)))
        row = reap(*child)
        row["at"] = child[2] - began
        rows.append(row)
        with (options.out / "fault-stall-watch.jsonl").open("a") as rows_file:  # kept if cut
            rows_file.write(json.dumps({"background": background, "ended": ended,
                                        "killed": killed, **row}) + "\n")  # fmt: skip
        time.sleep(options.every)
    return {
        "background": background,
        "ended": ended,
        "killed": killed,
        "exit": None if process is None else process.returncode,
        "small": rows,
    }


def watch_markdown(results: list[dict[str, Any]], options: argparse.Namespace) -> str:
    """Per background: its end (or kill), the children's life, and the windows of slow ones."""
    baseline = [row["life"] for result in results if result["background"] == "none"
                for row in result["small"]]  # fmt: skip
    slow_after = 3 * statistics.median(baseline) if baseline else 5.0
    lines = [
        f"`--watch`: small faulting children forked one after another ({options.every} s apart) "
        f"through each background's life and 2 s after; case `{options.case.name}`, kernel "
        f"filter `{options.kernel}`, killed after {options.kill_after} s where it says so. "
        f"Slow: a child's fork-to-reaped over {slow_after:.1f} s (3x the baseline's median).",
        "",
        "| background | ended s | killed s | children | life median / max s "
        "| slow children (forked at s: life s) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        rows = result["small"]
        slow = [f"{row['at']:.1f}: {row['life']:.1f}" for row in rows
                if row.get("life", 0) > slow_after]  # fmt: skip
        ended, killed = result["ended"], result["killed"]
        lines.append(
            f"| {result['background']} | {'-' if ended is None else f'{ended:.1f}'} | "
            f"{'-' if killed is None else f'{killed:.1f}'} | {len(rows)} | "
            f"{median_max(rows, 'life')} | {', '.join(slow) or 'none'} |"
        )
    return "\n".join(lines) + "\n"


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
    parser.add_argument("--backgrounds", nargs="+", choices=BACKGROUNDS + WATCHED,
                        help=f"default: {' '.join(BACKGROUNDS)}; with --watch: "
                             f"{' '.join(WATCHED)}")  # fmt: skip
    parser.add_argument("--watch", action="store_true",
                        help="children through each background's whole life (see above)")  # fmt: skip
    parser.add_argument("--case", type=Path, default=CASE, help="the corpus case to run")
    parser.add_argument("--kernel", default="add_pe_scale",
                        help="memcheck's kernel filter ('' for none; add_pe_scale)")  # fmt: skip
    parser.add_argument("--kill-after", type=float, default=8.0,
                        help="seconds before case-memcheck-killed is killed (8)")  # fmt: skip
    parser.add_argument("--every", type=float, default=0.3, help="seconds between children")
    parser.add_argument("--baseline-seconds", type=float, default=6.0,
                        help="how long `none` is watched (6)")  # fmt: skip
    options = parser.parse_args(argv)
    if options.backgrounds is None:
        options.backgrounds = list(WATCHED if options.watch else BACKGROUNDS)
    # the parent imports both, as reprocut's fork server does, and starts no CUDA (its
    # children could not then): without a GPU each child's report says so
    import cupy  # noqa: F401
    import torch  # noqa: F401

    options.out.mkdir(parents=True, exist_ok=True)
    name = "fault-stall-watch" if options.watch else "fault-stall-probe"
    results = []
    for background in options.backgrounds:
        result = (watch if options.watch else scenario)(background, options)
        if result is None:
            print(f"{background}: skipped (no compute-sanitizer)", flush=True)
            continue
        results.append(result)
        print(json.dumps(result) if not options.watch else  # the rows go to the .json
              f"{background}: {len(result['small'])} children", flush=True)  # fmt: skip
        # written after each background: a probe cut by its time limit keeps what it saw
        (options.out / f"{name}.json").write_text(json.dumps(results, indent=1))
        text = (watch_markdown if options.watch else markdown)(results, options)
        (options.out / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
