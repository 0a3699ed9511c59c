"""Whether an oracle's checks run with one CUDA connection (childenv.ONE_CONNECTION).

One hardware queue per context makes a check's CUDA start cheap when many run at once, and a
memory fault or a device assert happens the same way with it. A failure that needs kernels of
two streams to overlap cannot happen with one queue: so the first check decides. One that did
not reproduce with the setting, in a child that started CUDA, runs once more in a fresh process
without it; if that one reproduces, the oracle's later checks go without it too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from reprocut.check import check_log
from reprocut.check.childenv import ONE_CONNECTION, child_environment
from reprocut.check.verdicts import Cancelled, Reproduced, Verdict


class ConnectionChoice:
    """`on` until the first check says otherwise; `environment` for the oracle's children."""

    def __init__(self, *, blocking: bool) -> None:
        self.blocking = blocking
        self.on = True
        self._decided = False
        self._lock = threading.Lock()

    def environment(self, on: bool | None = None) -> dict[str, str]:
        return child_environment(
            blocking=self.blocking, one_connection=self.on if on is None else on
        )

    def first_verdict(
        self, reply: dict[str, Any], verdict: Verdict,
        rerun_without: Callable[[dict[str, str]], Verdict],
    ) -> tuple[Verdict, bool]:  # fmt: skip
        """(the verdict that stands, whether the setting was just turned off). Only the first
        verdict is looked at; `rerun_without(env)` runs the same check fresh in `env`."""
        with self._lock:
            if self._decided or not self.on:
                return verdict, False
            self._decided = True
        if isinstance(verdict, Reproduced | Cancelled):
            return verdict, False
        if not (reply.get("verdict") or {}).get("cuda"):  # no CUDA: the setting changed nothing
            return verdict, False
        if child_environment(blocking=False).get(ONE_CONNECTION[0]):  # the user set it
            return verdict, False
        again = rerun_without(self.environment(on=False))
        check_log.log("connections", first=type(verdict).__name__, without=type(again).__name__)
        if not isinstance(again, Reproduced):
            return verdict, False
        self.on = False
        return again, True
