"""Time budgets for stages that must not hold a report back: a deadline that long loops check,
and a call that is waited for at most so long.

An out-of-memory report has several stages after the failure (the walk from the user's
variables, the allocator snapshot, the request's explanation, the picture), and any of them can
meet something far bigger than usual: a graph of a million nodes, a snapshot whose stacks take
minutes to symbolize, a tensor of 36 GiB. Each stage gets a budget; one that runs out is
reported as skipped, with the reason, and the report goes out without it. A leaf module: it
imports nothing from reprocut.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Deadline:
    """A point in time that loops check now and then (`expired()` costs a clock read)."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    @property
    def at(self) -> float:
        return self.started + self.seconds

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def spent(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True, slots=True)
class Bounded(Generic[T]):
    """What a bounded call gave: its value, or why there is none (`skipped`), and its time."""

    value: T | None
    skipped: str | None
    seconds: float


def call_within(seconds: float, work: Callable[[], T]) -> Bounded[T]:
    """Run `work` in a daemon thread and wait for it at most `seconds`. A call that overruns
    is left to finish on its own (a thread cannot be stopped), its value dropped: the caller
    goes on without it. An exception is a skip too, with its text."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # the stage's failure is data here
            box["error"] = f"{type(exc).__name__}: {exc}"

    started = time.monotonic()
    thread = threading.Thread(target=run, name="reprocut-bounded", daemon=True)
    thread.start()
    thread.join(seconds)
    spent = time.monotonic() - started
    if thread.is_alive():
        return Bounded(None, f"did not finish within {seconds:g} s", spent)
    if "error" in box:
        return Bounded(None, f"failed: {box['error']}"[:300], spent)
    return Bounded(box.get("value"), None, spent)  # type: ignore[arg-type]
