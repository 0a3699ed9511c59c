"""The fixed-point loop: run named passes greedily until a full round makes no progress.

One total order (`sort_key`) says which case is simpler. `Shrinker.consider` is the only place
`best` changes: it rejects a candidate that is not strictly smaller before paying for a check,
and accepts it only if the predicate (same signature, via the oracle) holds. Every accepted case
goes to `on_accept` so an interrupted shrink keeps its best on disk. The loop knows no pass by
name: it takes them as an argument (`reprocut.shrink.passes.PASSES` is the default list).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reprocut.check import check_log
from reprocut.model.case import Captured, Generated, Literal, ReproCase, TensorSpec
from reprocut.model.limits import CHECK_CAP, FIXED_POINT, MAX_CHECKS, TimeLimit
from reprocut.source.speculation import BudgetSpent, Speculation

GENERATOR_RANK = {
    "zeros": 0,
    "ones": 1,
    "full": 2,
    "arange": 3,
    "randint": 4,
    "rand": 5,
    "randn": 6,
}
LITERAL_RANK = len(GENERATOR_RANK)
CAPTURED_RANK = LITERAL_RANK + 1


def values_rank(values: Captured | Literal | Generated) -> int:
    if isinstance(values, Captured):
        return CAPTURED_RANK
    if isinstance(values, Literal):
        return LITERAL_RANK
    return GENERATOR_RANK.get(values.kind, LITERAL_RANK - 1)


def sort_key(case: ReproCase) -> tuple[Any, ...]:
    """Smaller is simpler. Every pass moves cases down this order, so the loop terminates."""
    specs = [spec for _, spec in case.tensors()]
    return (
        case.total_numel(),
        case.num_captured_values(),
        case.num_args(),
        sum(len(spec.shape) for spec in specs),
        tuple(spec.complexity() for spec in specs),
        tuple(values_rank(spec.values) for spec in specs),
        sum(spec.requires_grad for spec in specs),
    )


@dataclass(frozen=True, slots=True)
class ShrinkEvent:
    """What the shrinker is doing, for the display: kind is "pass", "check", "accepted",
    "round" (a round changed the best: another follows), "done"."""

    kind: str
    pass_name: str
    best: ReproCase
    checks: int
    size: int  # total tensor elements of best


Predicate = Callable[[ReproCase], bool]
Pass = Callable[["Shrinker"], None]


class CaseChecks(Protocol):
    """How candidates run side by side (reprocut.source.speculation's Checks, for cases):
    `run` on a worker thread in slot `slot`, `settle` in the pass's order, `accepts` says
    whether a settled verdict is the same failure (what the predicate says of one alone)."""

    slots: int

    def run(self, case: ReproCase, slot: int, ticket: Any) -> Any: ...

    def settle(self, case: ReproCase, slot: int, verdict: Any) -> Any: ...

    def accepts(self, verdict: Any) -> bool: ...


class BudgetExhausted(Exception):
    """Raised inside a pass when max_checks or max_time is used up; the loop stops cleanly."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Shrinker:
    """Greedy fixed-point shrinking of one ReproCase under a predicate: it ends when a full
    round of passes changes nothing (`stopped` "fixed point"), or at a limit: `max_checks`,
    `max_time` (the user's --max-time; None: the safety cap, a net under the fixed point)."""

    def __init__(
        self,
        initial: ReproCase,
        predicate: Predicate,
        *,
        passes: Sequence[Pass],
        inputs: Mapping[str, Any] | None = None,
        max_checks: int = CHECK_CAP,
        max_time: float | None = None,
        on_event: Callable[[ShrinkEvent], None] | None = None,
        on_accept: Callable[[ReproCase], None] | None = None,
        cpu_visible: bool = False,
        runner: CaseChecks | None = None,
        ways: int = 1,
    ) -> None:
        """`runner`: checks a pass's alternatives side by side (`consider_first`); its verdicts
        are taken in order, so best and checks are those of one check at a time. `ways`: a
        dimension's search cuts its span this many ways a round, the cuts checked side by side
        (1: to 1, halving, then by one, as one check at a time would)."""
        self.best = initial
        self.predicate = predicate
        self.passes = list(passes)
        self.inputs = dict(inputs or {})
        self.max_checks = max_checks
        self.limit = TimeLimit.from_option(max_time)
        self.on_event = on_event or (lambda event: None)
        self.on_accept = on_accept or (lambda case: None)
        self.cpu_visible = cpu_visible
        self.checks = 0
        self.exhausted = False
        self.stopped = ""  # what ended run(): "fixed point" or the limit reached
        self.current_pass = ""
        self.stats: dict[str, list[int]] = {}  # pass name -> [checks, accepted]
        self._seen: set[ReproCase] = set()
        self._started = time.monotonic()
        self.runner = runner
        self.ways = ways
        self._speculation: Speculation | None = None

    def consider(self, candidate: ReproCase) -> bool:
        """Accept `candidate` as the new best if it is strictly simpler and still fails the same way."""
        if not self.admissible(candidate):
            return False
        reason = self.out_of_budget()
        if reason is not None:
            raise BudgetExhausted(reason)
        return self._checked(candidate, self.predicate(candidate), self.current_pass)

    def consider_first(self, candidates: Sequence[ReproCase]) -> bool:
        """`any(consider(c) for c in candidates)`: the first, in order, that is accepted; with a
        runner of several slots the next ones are checked meanwhile (those after an accepted one
        are dropped, uncounted), so the result and the check count are the same."""
        if self.runner is None or self.runner.slots < 2:
            return any(self.consider(candidate) for candidate in candidates)
        if self._speculation is None:
            self._speculation = Speculation(self.runner, merge=False, lookahead=False)  # type: ignore[arg-type]
        options = [(candidate, candidate) for candidate in candidates]
        try:
            chosen = self._speculation.first_accepted(self, options, self.current_pass)  # type: ignore[arg-type]
        except BudgetSpent as exc:
            raise BudgetExhausted(exc.reason) from None
        return chosen is not None

    def admissible(self, candidate: ReproCase) -> bool:
        """Worth a check: strictly simpler than the best, and not checked before."""
        return sort_key(candidate) < sort_key(self.best) and candidate not in self._seen

    def out_of_budget(self, in_flight: int = 0) -> str | None:
        if self.checks + in_flight >= self.max_checks:
            return MAX_CHECKS
        if time.monotonic() - self._started > self.limit.seconds:
            return self.limit.reason
        return None

    def take(self, candidate: ReproCase, verdict: Any, pass_name: str) -> bool:
        """A runner's settled verdict, in the pass's order (the speculation's side)."""
        assert self.runner is not None
        return self._checked(candidate, self.runner.accepts(verdict), pass_name)

    def _checked(self, candidate: ReproCase, accepted: bool, pass_name: str) -> bool:
        """A candidate checked: the only place `best` changes."""
        self._seen.add(candidate)
        self.checks += 1
        stats = self.stats.setdefault(pass_name, [0, 0])
        stats[0] += 1
        self._emit("check")
        if not accepted:
            return False
        stats[1] += 1
        self.best = candidate
        self.on_accept(candidate)
        self._emit("accepted")
        return True

    def run(self) -> ReproCase:
        """Run every pass in turn until a whole round leaves `best` unchanged (or budget ends)."""
        try:
            while True:
                before = self.best
                for shrink_pass in self.passes:
                    self.current_pass = getattr(shrink_pass, "__name__", repr(shrink_pass))
                    self._emit("pass")
                    shrink_pass(self)
                if self.best is before:
                    self.stopped = FIXED_POINT
                    break
                self._emit("round")  # the best changed: another round follows
        except BudgetExhausted as exc:
            self.exhausted = True
            self.stopped = exc.reason
        finally:
            if self._speculation is not None:
                self._speculation.close()
                self._speculation = None
        self._emit("done")
        return self.best

    def _emit(self, kind: str) -> None:
        size = self.best.total_numel()
        if kind in ("pass", "accepted", "done"):
            check_log.log(kind, reducer="case", pass_name=self.current_pass, checks=self.checks,
                          size=size)  # fmt: skip
        self.on_event(ShrinkEvent(kind, self.current_pass, self.best, self.checks, size))


def known_values(shrinker: Shrinker, spec: TensorSpec) -> list[Any] | None:
    """Row-major values of a dense tensor whose values are known: Literal, or Captured and
    among the shrinker's loaded inputs. None when they are generated or not loaded."""
    if isinstance(spec.values, Literal):
        return list(spec.values.values)
    if isinstance(spec.values, Captured) and spec.values.key in shrinker.inputs:
        tensor = shrinker.inputs[spec.values.key]
        return list(tensor.detach().cpu().reshape(-1).tolist())[: spec.numel]
    return None


def keep_chunks(
    count: Callable[[], int | None], keep: Callable[[list[int]], bool], max_chunks: int = 8
) -> None:
    """Delta debugging's coarse half: try keeping each half of `count()` items, then each
    quarter, eighth, ... up to `max_chunks`; after a success start again at halves. `count`
    answers None (or <= 1) when there is nothing left to cut. Bounded: a failure that needs many
    scattered items costs at most 14 failed checks per success."""
    chunks = 2
    while True:
        n = count()
        if n is None or n <= 1 or chunks > min(n, max_chunks):
            return
        size = math.ceil(n / chunks)
        for start in range(0, n, size):
            if keep(list(range(start, min(n, start + size)))):
                chunks = 2
                break
        else:
            chunks *= 2


def find_integer(f: Callable[[int], bool]) -> int:
    """The largest n with f(n) true, given f(0): k successes cost O(log k) calls (Hypothesis)."""
    for i in range(1, 5):
        if not f(i):
            return i - 1
    low, high = 4, 5
    while f(high):
        low, high = high, high * 2
    while low + 1 < high:
        mid = (low + high) // 2
        if f(mid):
            low = mid
        else:
            high = mid
    return low


def shrink(
    initial: ReproCase, predicate: Predicate, passes: Sequence[Pass], **options: Any
) -> ReproCase:
    """Shrink `initial` under `predicate` with `passes` (`reprocut.shrink.passes.PASSES` has all)."""
    return Shrinker(initial, predicate, passes=passes, **options).run()
