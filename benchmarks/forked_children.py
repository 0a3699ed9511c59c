"""Children forked from a probe's parent (which imported torch, as reprocut's fork server does),
each reporting one JSON object on a pipe of its own: the GPU probes' common part
(cuda_start_probe.py, fault_stall_probe.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

Child = tuple[int, int, float]  # its pid, the pipe it reports on, when it was forked


def fork(run: Callable[[int], None]) -> Child:
    """A child that calls `run(write_fd)`, which writes its report there and exits; a child
    whose `run` returns or raises exits with 1, its report empty."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            run(write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    return pid, read_fd, time.perf_counter()


def reap(pid: int, read_fd: int, forked: float) -> dict[str, Any]:
    """A child's report, with its seconds from fork to report (`reported`), from report to
    reaped (`teardown`: its exit and the driver's teardown) and from fork to reaped (`life`)."""
    raw = b""
    while chunk := os.read(read_fd, 4096):
        raw += chunk
    os.close(read_fd)
    reported = time.perf_counter()
    os.waitpid(pid, 0)
    reaped = time.perf_counter()
    row = json.loads(raw or b"{}")
    row.update(reported=reported - forked, teardown=reaped - reported, life=reaped - forked)
    return row
