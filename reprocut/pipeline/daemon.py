"""Work on a daemon thread, its answer a Future: what a shrink starts beside itself and may
no longer need (a memcheck, a verification ahead) does not hold the process when it ends
early, as a pool's thread would."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def in_daemon_thread(
    work: Callable[[], T], future: Future[T] | None = None, *, name: str
) -> Future[T]:
    """`work` on a daemon thread named `name`; its result (or exception) in `future` (a new
    one if None)."""
    done: Future[T] = Future() if future is None else future

    def run() -> None:
        try:
            done.set_result(work())
        except BaseException as exc:  # the caller's .result() raises it
            done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done
