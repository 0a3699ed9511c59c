"""What ends a reduction, and the time limit it runs under.

A reduction (the op-level shrinker, the source reducer, the compiled path) ends at its fixed
point: a full round of passes that removes nothing. A clock is only a net under it: the safety
cap, far above what a reduction normally takes, or the user's own `--max-time`. Where checks
are expensive a short clock stops the repro before it is small (at 30 s a CPU script reduction
ended at 49 lines, not 30), so the clock is never the normal end. The words below are what
`stopped` says in `--json` and meta.json. A leaf module: it imports nothing from reprocut.
"""

from __future__ import annotations

from dataclasses import dataclass

FIXED_POINT = "fixed point"  # a full round of passes removed nothing
MAX_CHECKS = "max checks"  # --max-checks
MAX_TIME = "max time"  # --max-time
SAFETY_CAP_HIT = "safety cap"  # no --max-time: the safety cap

# seconds a reduction may run when the user gave no --max-time: a net, not the normal end
SAFETY_CAP = 600.0
# checks a reduction may run when the user gave no --max-checks: a net as well (a CPU check
# can take a tenth of a second; the fixed points measured took 80-500 checks)
CHECK_CAP = 2000


@dataclass(frozen=True, slots=True)
class TimeLimit:
    """How long a reduction may run, and what stopping there is called (`stopped`)."""

    seconds: float
    user: bool = False  # --max-time (else the safety cap)

    @classmethod
    def from_option(cls, max_time: float | None) -> TimeLimit:
        """--max-time's value (None: not given) as a limit."""
        return cls(SAFETY_CAP, False) if max_time is None else cls(float(max_time), True)

    @property
    def reason(self) -> str:
        return MAX_TIME if self.user else SAFETY_CAP_HIT


def stopped_by_a_limit(stopped: str) -> bool:
    """Did a limit (not the fixed point) end the reduction?"""
    return stopped in (MAX_CHECKS, MAX_TIME, SAFETY_CAP_HIT)
