"""What a shrink may do: the `reprocut shrink` options and the limits they fall back on.

With no --max-time a reduction runs to its fixed point under the safety cap
(reprocut.model.limits); the plain-run confirmations of its candidates have bounds of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reprocut.model.limits import CHECK_CAP, SAFETY_CAP, TimeLimit
from reprocut.model.recording import Failure
from reprocut.model.signature import is_memory_error

# the share of --max-time that plain-run confirmations may take; the final verification and
# the walk-back answer for the candidates accepted after that
PLAIN_SHARE = 0.2
# Plain-run confirmations with no --max-time, in seconds: about two plain runs of a script's
# candidate on the H200 (3.7 s each: import torch, CUDA start; a memory fault's captured call
# runs the user's kernel, as long), six of another captured call's. They confirm what a fork
# may judge differently; the final verification and the walk-back decide, so a reduction that
# runs longer to its fixed point needs no more of them (they were a fifth of the former 30 s
# and 120 s default clocks).
PLAIN_SECONDS_SCRIPT = 6.0
PLAIN_SECONDS_CASE = 24.0
# children of the fork server starting their CUDA contexts ahead of a captured call's checks
STANDBY_DEPTH = 3


@dataclass(frozen=True, slots=True)
class ShrinkSettings:
    """What a shrink may do (the `reprocut shrink` options)."""

    out: Path | None = None  # default: the run folder
    max_checks: int = CHECK_CAP
    max_time: float | None = None  # None: to the fixed point, under the safety cap
    timeout: float = 60.0  # per check; plain runs get twice that
    fork: bool = True
    source: bool = False
    runs: int = 3

    def time_limit(self) -> TimeLimit:
        """The reduction's time limit: --max-time, else the safety cap (its fixed point is the
        normal end)."""
        return TimeLimit.from_option(self.max_time)

    def plain_seconds(self, failure: Failure, *, script: bool) -> float:
        """Seconds of plain-run confirmations for the reduction's candidates: a script's or a
        memory fault's (each run is a run of the user's code on the GPU) or another captured
        call's; with --max-time, no more than PLAIN_SHARE of it."""
        seconds = (
            PLAIN_SECONDS_SCRIPT
            if script or is_memory_error(failure.signature)
            else PLAIN_SECONDS_CASE
        )
        if self.max_time is not None:
            seconds = min(seconds, self.max_time * PLAIN_SHARE)
        return seconds


def limits_json(settings: ShrinkSettings) -> dict[str, float | int | None]:
    """The limits a shrink ran under, for `--json`: --max-time (None: not given, so the
    reduction ran to its fixed point under the safety cap), the cap, --max-checks."""
    return {
        "max_time": settings.max_time,
        "safety_cap": SAFETY_CAP,
        "max_checks": settings.max_checks,
    }
