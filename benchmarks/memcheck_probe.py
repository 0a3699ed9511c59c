"""What compute-sanitizer costs a CuPy shrink on the GPU, part by part (results:
benchmarks/results/memcheck-probe-cuda.md).

    OUT=DIR python benchmarks/memcheck_probe.py [beside] [options]

`beside`: a check as the fork server runs it (a child forked from a parent that imported torch
and CuPy, running a committed CuPy repro) timed alone, then beside memchecks of the four CuPy
corpus cases' whole training scripts (as a script reduction runs its original's), then beside
the same memchecks under `nice -n 10`: does the original's memcheck slow the reduction's checks?
`options`: memcheck of that repro alone with each option set, against a plain run and the bare
imports: is there an option that makes the final repro's memcheck cheaper?
Needs CUDA, CuPy and compute-sanitizer; the log goes to $OUT/probe.log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "benchmarks/results/faults-cuda-repros/cuda_cupy_hashed_ids.py"
KERNEL = "hashed_bag"
CASES = {
    "cuda_cupy_hashed_ids": "hashed_bag",
    "cuda_cupy_contiguous_pe": "add_pe_scale",
    "cuda_cupy_host_pointers": "gather_rows_kernel",
    "cuda_cupy_misaligned_vec4": "cmvn_vec4",
}
OPTION_SETS: dict[str, tuple[str, ...]] = {
    "as reprocut runs it": (),
    "--check-device-heap no": ("--check-device-heap", "no"),
    "--check-api-memory-access no": ("--check-api-memory-access", "no"),
    "--show-backtrace no": ("--show-backtrace", "no"),
}
SANITIZER = "compute-sanitizer"
IMPORTS = "import torch, cupy; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def say(self, *parts: object) -> None:
        line = " ".join(str(part) for part in parts)
        print(line, flush=True)
        with self.path.open("a") as stream:
            stream.write(line + "\n")


def memcheck(target: Sequence[str], kernel: str | None, extra: Sequence[str] = ()) -> list[str]:
    """The command reprocut's run_memcheck builds (without its tensor-map wrapper)."""
    focus = ["--kernel-name", f"kns={kernel}"] if kernel else []
    return [SANITIZER, "--tool", "memcheck", "--print-limit", "20", "--padding", "65536",
            *focus, *extra, "--log-file", "/dev/null", sys.executable, *target]  # fmt: skip


def timed(command: Sequence[str], env: dict[str, str] | None = None) -> str:
    """Wall seconds and exit status of one run."""
    started = time.perf_counter()
    environment = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", **(env or {})}
    try:
        done = subprocess.run(command, env=environment, capture_output=True, timeout=120)
        status: object = done.returncode
    except subprocess.TimeoutExpired:
        status = "timeout"
    return f"{time.perf_counter() - started:.2f} s (exit {status})"


def options(log: Log) -> None:
    log.say("== memcheck on the repro alone")
    log.say(subprocess.run([SANITIZER, "--version"], capture_output=True, text=True).stdout.strip())
    log.say("plain python repro.py:", timed([sys.executable, str(REPRO)]))
    log.say("plain imports + CUDA context:", timed([sys.executable, "-c", IMPORTS]))
    log.say("the same under memcheck:", timed(memcheck(["-c", IMPORTS], KERNEL)))
    for name, extra in OPTION_SETS.items():
        for _ in range(2):
            log.say(f"memcheck, {name}:", timed(memcheck([str(REPRO)], KERNEL, extra)))
    log.say("memcheck, every kernel:", timed(memcheck([str(REPRO)], None)))


def children(log: Log, count: int, label: str) -> None:
    """`count` checks one after another, each a child forked from this (preloaded) process."""
    code = compile(REPRO.read_text(), str(REPRO), "exec")
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            try:
                exec(code, {"__name__": "__main__"})
            except BaseException:
                os._exit(1)
            os._exit(0)
        os.waitpid(pid, 0)
        seconds.append(round(time.perf_counter() - started, 2))
    log.say(f"{label}: checks {seconds}, median {sorted(seconds)[len(seconds) // 2]}")


def originals(log: Log, nice: bool) -> threading.Thread:
    """memcheck of each CuPy case's whole training script, all at once, on a thread."""
    running = []
    for case, kernel in CASES.items():
        command = memcheck([str(ROOT / "corpus" / case / "train.py")], kernel)
        command = ["nice", "-n", "10", *command] if nice else command
        env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
        process = subprocess.Popen(command, cwd=ROOT / "corpus" / case, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        running.append((case, process, time.perf_counter()))

    def wait() -> None:
        for case, process, started in running:
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
            took = time.perf_counter() - started
            log.say(f"original memcheck {case}{' (nice)' if nice else ''}: {took:.1f} s")

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def beside(log: Log) -> None:
    log.say("== checks beside memchecks of the originals")
    import cupy  # noqa: F401  (the fork server's preload)
    import torch  # noqa: F401

    children(log, 3, "warm-up")
    children(log, 8, "alone")
    for nice in (False, True):
        thread = originals(log, nice)
        children(log, 20, f"beside 4 memchecks{' (nice)' if nice else ''}")
        thread.join()
        children(log, 5, "alone again")


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp"))
    log = Log(out / "probe.log")
    parts = sys.argv[1:] or ["beside", "options"]
    if "beside" in parts:
        beside(log)
    if "options" in parts:
        options(log)


if __name__ == "__main__":
    main()
