"""Where a shrink's time goes: named phases, timed as they run.

Some phases run side by side (the fork server starts while the recording is read), so their
seconds can add up to more than the wall time. Each start and end goes to `on_phase` (the
progress display); `to_json` is what meta.json and `--json` hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from reprocut.check import check_log

FORK_SERVER = "fork_server"  # until the fork server was ready (0 when it was already up)
READ = "read"  # failure.json, inputs.pt (importing torch), the environment
FIRST_CHECK = "first_check"  # the recorded call, checked from its captured inputs
SHRINK = "shrink"  # the passes, to a fixed point
SOURCE = "source_reduce"  # instead of the two above, for custom kernels and --source
CPU_CHECK = "cpu_check"
VERIFY = "verify"  # the plain `python repro.py` runs, side by side
REPORT = "report"


@dataclass(frozen=True, slots=True)
class PhaseEvent:
    """A phase started (seconds None) or ended (after `seconds`)."""

    phase: str
    seconds: float | None = None


class Phases:
    """Seconds per phase, in the order phases ended; safe to use from several threads."""

    def __init__(self, on_phase: Callable[[PhaseEvent], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.on_phase = on_phase or (lambda event: None)
        self._lock = threading.Lock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.on_phase(PhaseEvent(name))
        check_log.log("phase", phase=name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        """A phase timed elsewhere (or again: the seconds add up)."""
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        check_log.log("phase", phase=name, seconds=round(seconds, 3))
        self.on_phase(PhaseEvent(name, seconds))

    def to_json(self) -> dict[str, float]:
        with self._lock:
            return {name: round(seconds, 3) for name, seconds in self.seconds.items()}
