"""What a shrink may do: the `reprocut shrink` options and the default limits they fall back on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reprocut.model.recording import Failure
from reprocut.model.signature import is_memory_error

# the share of --max-time that plain-run confirmations may take; the final verification and
# the walk-back answer for the candidates accepted after that
PLAIN_SHARE = 0.2
# children of the fork server starting their CUDA contexts ahead of a captured call's checks
STANDBY_DEPTH = 3
# Default limits: a script reduction gets most of its cut from its first passes; at 30 s the
# H200's fault cases took 46 s median to a verified repro (110-343 s at 300 s).
SCRIPT_TIME = 30.0
CASE_TIME = 120.0


@dataclass(frozen=True, slots=True)
class ShrinkSettings:
    """What a shrink may do (the `reprocut shrink` options)."""

    out: Path | None = None  # default: the run folder
    max_checks: int = 500
    max_time: float | None = None  # None: SCRIPT_TIME (a script, a memory fault), else CASE_TIME
    timeout: float = 60.0  # per check; plain runs get twice that
    fork: bool = True
    source: bool = False
    runs: int = 3

    def time_limit(self, failure: Failure, *, script: bool) -> float:
        """The reduction's time limit: --max-time, else the default for its kind (a memory
        fault's captured call gets a script's: each check runs the user's kernel on inputs of
        up to gigabytes, seconds a check, and the first passes make most of the cut)."""
        if self.max_time is not None:
            return self.max_time
        return SCRIPT_TIME if script or is_memory_error(failure.signature) else CASE_TIME
