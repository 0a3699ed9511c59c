"""Checking a pass's next candidates side by side, while taking the same answers in order.

Most candidates are rejected, so the candidates a pass would try after a rejection are known
ahead (`Options`: each made as if the ones before it were rejected). Up to `slots` of them run at
once (one fork-server child each, like shrinkray's parallel search); their verdicts are taken
strictly in the pass's order, and the first that reproduces wins: later ones still running are
cancelled and their verdicts dropped, uncounted. Without merging, the reducer accepts exactly
what a one-at-a-time run would, in the same order, with the same check count; only the wall
time differs. With it (the default), candidates beside the accepted one that reproduced too
are laid over it (`reprocut.source.merge`) and checked together first among the pass's next
ones: one check then takes what a chain of checks would, and the result is a fixed point all
the same (the reducer's last round finds nothing), though not always the one-at-a-time one.
Slots a pass leaves idle (its last candidates in flight) check the first candidates of the
passes after it, made from the same best (`Lookahead`); those passes take these verdicts in
their turn, so a round that finds nothing costs its checks over the slots, not a wait per pass.
A verdict that contention can explain (CUDA out of memory: the GPU's memory is shared by the
checks in flight) is taken only after the candidate ran again alone; a timeout is taken as it
is (checks take a second or so, their timeout is a minute).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, Protocol

from reprocut.check import check_log
from reprocut.check.connection import Ticket
from reprocut.source.merge import merged

# Candidates in flight at most. On the 2-core CPU machine two at once did not help (a CPU check
# is 0.06-0.1 s and the reducer making the next candidates needs the other core); past about
# four, most of what runs ahead is discarded once an earlier candidate is accepted (12-57 of
# 80-280 checks were at two), while each GPU check holds a CUDA context and a core.
MAX_SLOTS = 4
# Once a candidate is taken, the ones beside it are waited for this share of its own check's
# time (at most GRACE_CAP seconds) to be merged with it; the rest are cancelled. None: on the
# H200 a quarter (5-8 s of waiting per shrink, four at once) bought 0-4 merges in 13-20 takes,
# and no fewer acceptances; the ones already answered merge for free.
GRACE = 0.0
GRACE_CAP = 1.0


def default_slots(cores: int | None = None) -> int:
    """Candidates in flight at once: half the cores (each check's child and its kernel compiles
    want a core, the reducer making candidates another), at most MAX_SLOTS: one on a 2-core
    laptop, four on the H200 host's 16 cores."""
    count = os.cpu_count() if cores is None else cores
    return max(1, min(MAX_SLOTS, (count or 1) // 2))


class Checks(Protocol):
    """How candidates run: `run` on a worker thread, in slot `slot` (its own file), `settle` on
    the reducer's thread in the pass's order (a plain-run confirmation may change the verdict)."""

    slots: int

    def run(self, code: str, slot: int, ticket: Ticket | None) -> Any: ...

    def settle(self, code: str, slot: int, verdict: Any) -> Any: ...


@dataclass
class CallableChecks:
    """A `check(code) -> verdict` callable as Checks (pure predicates, fresh-process checks)."""

    check: Callable[[str], Any]
    slots: int = 1

    def run(self, code: str, slot: int, ticket: Ticket | None) -> Any:
        return self.check(code)

    def settle(self, code: str, slot: int, verdict: Any) -> Any:
        return verdict


def check_alone(checks: Checks, code: str) -> Any:
    """One check, on the caller's thread, settled."""
    return checks.settle(code, 0, checks.run(code, 0, None))


def contended(verdict: Any) -> bool:
    """Could running beside other checks have caused this verdict (and not the candidate)?"""
    signature = getattr(verdict, "signature", None)
    text = f"{getattr(signature, 'kind', '')} {getattr(verdict, 'message', '')}".lower()
    return "out of memory" in text


class Reducer(Protocol):
    """What the speculation needs of the reducer (reprocut.source.fixed_point.SourceReducer)."""

    def admissible(self, candidate: str, pass_name: str | None = None) -> bool: ...

    def upcoming(self) -> Iterator[tuple[str, str]]: ...

    def out_of_budget(self, in_flight: int) -> str | None: ...

    def take(self, candidate: str, verdict: Any, pass_name: str) -> bool: ...

    def is_same_failure(self, verdict: Any) -> bool: ...

    @property
    def best(self) -> str: ...


class BudgetSpent(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Flight:
    tag: Any
    candidate: str
    slot: int
    ticket: Ticket
    future: Future[Any] | None = None  # None: ran inline (one slot)
    verdict: Any = None
    started: float = field(default_factory=time.monotonic)

    def result(self) -> Any:
        return self.verdict if self.future is None else self.future.result()

    def done(self) -> bool:
        return self.future is None or self.future.done()


@dataclass(frozen=True, slots=True)
class _Merged:
    """Candidates laid over the one a pass took: tried first among that pass's next ones."""

    pass_name: str
    base: str  # the best they were laid over (the taken candidate)
    tag: Any  # the taken candidate's: the pass goes on from there
    code: str


@dataclass
class Lookahead:
    """Checks begun in idle slots for the passes after the current one, all made from one best
    (`base`): a pass whose candidates are among them takes their verdicts instead of running
    them again. Late in a reduction most passes find nothing, and each waited for the one
    before it with slots idle (on the H200, 25-31 s of the two Triton cases' 100-115 s)."""

    free: list[int]  # the slot files kept for them
    flights: dict[str, _Flight] = field(default_factory=dict)
    base: str | None = None
    _candidates: Iterator[tuple[str, str]] | None = None

    def follow(self, best: str) -> None:
        """What was begun from another best is of no use: dropped."""
        if best != self.base:
            self.drop()
            self.base = best

    def running(self) -> int:
        return sum(not flight.done() for flight in self.flights.values())

    def next_candidate(self, reducer: Reducer, flying: deque[_Flight]) -> tuple[str, str] | None:
        """The next (pass name, candidate) of the passes to come worth a check."""
        if self._candidates is None:
            self._candidates = reducer.upcoming()
        for pass_name, candidate in self._candidates:
            if candidate in self.flights or any(f.candidate == candidate for f in flying):
                continue
            if reducer.admissible(candidate, pass_name):
                return pass_name, candidate
        return None

    def drop(self) -> int:
        """Cancel every check begun and forget them; how many there were."""
        for flight in self.flights.values():
            flight.ticket.cancel()
        for flight in self.flights.values():
            with contextlib.suppress(Exception):  # a cancelled check's failure is of no interest
                flight.result()
            self.free.append(flight.slot)
        dropped = len(self.flights)
        self.flights.clear()
        self._candidates = None
        return dropped


@dataclass
class Speculation:
    """Runs a reducer's Options `checks.slots` at a time."""

    checks: Checks
    merge: bool = True  # lay reproducing candidates beside a taken one over it (module doc)
    lookahead: bool = True  # idle slots check the next passes' first candidates (Lookahead)
    discarded: int = 0  # runs whose verdicts a one-at-a-time run would never have asked for
    rerun: int = 0  # verdicts taken only after running again alone
    merges: int = 0  # merged candidates offered
    looked_ahead: int = 0  # checks begun for a later pass
    adopted: int = 0  # of those, the ones whose verdicts that pass took
    _pool: ThreadPoolExecutor | None = None
    _free: list[int] = field(default_factory=list)
    _merged: _Merged | None = None
    _ahead: Lookahead | None = None

    def __post_init__(self) -> None:
        slots = self.checks.slots
        self._free = list(range(slots - 1, -1, -1))
        if slots > 1:  # the slots past `slots` are the original's (one) and the lookahead's
            self._pool = ThreadPoolExecutor(2 * slots, thread_name_prefix="reprocut-check")
            if self.lookahead:
                self._ahead = Lookahead(list(range(2 * slots, slots, -1)))

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.drop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def first_accepted(
        self,
        reducer: Reducer,
        items: Iterable[tuple[Any, str | None]],
        pass_name: str,
        merge: bool = True,
    ) -> tuple[Any, str] | None:
        """The first (tag, candidate) the reducer takes, trying them in order; None if none.
        `merge`: a pass's Options (each made from the best): a merged candidate waiting for
        this pass goes first, and the ones beside a taken candidate may be merged with it."""
        queue: Iterator[tuple[Any, str | None]] = iter(items)
        pending = self._pending(reducer, pass_name) if merge else None
        if pending is not None:
            queue = itertools.chain([pending], queue)
        ahead = self._ahead
        if ahead is not None:
            ahead.follow(reducer.best)
        flying: deque[_Flight] = deque()
        held: tuple[Any, str] | None = None
        try:
            while True:
                while len(flying) < self.checks.slots and (
                    not flying or self._busy(flying) < self.checks.slots
                ):  # the one this pass waits on starts even if checks begun ahead fill the slots
                    held = held or self._next(reducer, queue, flying)
                    if held is None:
                        if ahead is not None and flying:  # this pass has no more: the next's
                            self._look_ahead(reducer, ahead, flying)
                        break
                    reason = reducer.out_of_budget(len(flying))
                    if reason is not None:
                        if not flying:
                            raise BudgetSpent(reason)
                        break
                    flying.append(self._start(*held, ahead=len(flying)))
                    held = None
                if not flying:
                    return None
                head = flying.popleft()
                head.ticket.ahead = 0  # the one the reducer waits on; the head before it answered
                for rank, flight in enumerate(flying, start=1):
                    flight.ticket.ahead = rank
                verdict = head.result()
                if contended(verdict) and self.checks.slots > 1:
                    for other in flying:  # let the others finish, then run it again alone
                        other.result()
                    verdict = self.checks.run(head.candidate, head.slot, None)
                    self.rerun += 1
                base = reducer.best if merge and self.merge else ""
                try:
                    verdict = self.checks.settle(head.candidate, head.slot, verdict)
                    taken = reducer.take(head.candidate, verdict, pass_name)
                finally:
                    self._release(head.slot)
                if taken:
                    if ahead is not None:
                        self.discarded += ahead.drop()  # made from the best before this one
                    if merge and self.merge and flying:
                        self._merge_beside(reducer, base, head, flying, pass_name)
                    return head.tag, head.candidate
        finally:
            self._drop(flying)

    def _pending(self, reducer: Reducer, pass_name: str) -> tuple[Any, str] | None:
        """The merged candidate waiting for this pass, if it was made from the best."""
        pending, self._merged = self._merged, None
        if pending is None or (pending.pass_name, pending.base) != (pass_name, reducer.best):
            return None
        return pending.tag, pending.code

    def _busy(self, flying: deque[_Flight]) -> int:
        """Checks holding a slot: this pass's, and the lookahead's still running."""
        return len(flying) + (0 if self._ahead is None else self._ahead.running())

    def _look_ahead(self, reducer: Reducer, ahead: Lookahead, flying: deque[_Flight]) -> None:
        """Fill the idle slots with the next passes' first candidates, made from the best."""
        while self._busy(flying) < self.checks.slots and ahead.free:
            found = ahead.next_candidate(reducer, flying)
            if found is None:
                return
            pass_name, candidate = found
            slot = ahead.free.pop()
            flight = _Flight(None, candidate, slot, Ticket())
            flight.ticket.ahead = self.checks.slots + len(ahead.flights)  # behind this pass's
            assert self._pool is not None
            flight.future = self._pool.submit(self.checks.run, candidate, slot, flight.ticket)
            ahead.flights[candidate] = flight
            self.looked_ahead += 1
            check_log.log("ahead", pass_name=pass_name, slot=slot)

    def _release(self, slot: int) -> None:
        """A slot's file is free again (its check was taken or dropped)."""
        if slot < self.checks.slots:
            self._free.append(slot)
        elif self._ahead is not None:
            self._ahead.free.append(slot)

    def forget_merged(self) -> None:
        """A pass ended: what was merged for it is not the next pass's to try."""
        self._merged = None

    def _merge_beside(
        self, reducer: Reducer, base: str, head: _Flight, flying: deque[_Flight], pass_name: str
    ) -> None:
        """Wait a little (GRACE) for the candidates beside `head`, and keep those that
        reproduced, laid over it, for the pass's next Options."""
        grace = min(GRACE_CAP, GRACE * (time.monotonic() - head.started))
        running = [f.future for f in flying if f.future is not None and not f.future.done()]
        if running and grace > 0:
            wait_for(running, timeout=grace)
        alike = []
        for flight in flying:
            if not flight.done():
                continue
            with contextlib.suppress(Exception):  # a check that failed to run merges nothing
                verdict = flight.result()
                if not contended(verdict) and reducer.is_same_failure(verdict):
                    alike.append(flight.candidate)
        code = merged(base, head.candidate, alike) if alike else None
        check_log.log("merge", pass_name=pass_name, beside=len(flying), alike=len(alike),
                      merged=code is not None, grace=round(grace, 3))  # fmt: skip
        if code is not None:
            self.merges += 1
            self._merged = _Merged(pass_name, head.candidate, head.tag, code)

    def _next(
        self, reducer: Reducer, queue: Iterator[tuple[Any, str | None]], flying: deque[_Flight]
    ) -> tuple[Any, str] | None:
        """The next candidate worth a check (one in flight already is not: as a repeat of a
        rejected one it would not be checked again)."""
        for tag, candidate in queue:
            if candidate is None or any(f.candidate == candidate for f in flying):
                continue
            if reducer.admissible(candidate):
                return tag, candidate
        return None

    def _start(self, tag: Any, candidate: str, ahead: int = 0) -> _Flight:
        adopted = None if self._ahead is None else self._ahead.flights.pop(candidate, None)
        if adopted is not None:  # begun while the pass before ran: its verdict is this one's
            adopted.tag = tag
            adopted.ticket.ahead = ahead
            self.adopted += 1
            check_log.log("adopted", done=adopted.done(), slot=adopted.slot)
            return adopted
        slot = self._free.pop()
        flight = _Flight(tag, candidate, slot, Ticket())
        flight.ticket.ahead = ahead
        if self._pool is None:
            flight.verdict = self.checks.run(candidate, slot, flight.ticket)
        else:
            flight.future = self._pool.submit(self.checks.run, candidate, slot, flight.ticket)
        return flight

    def _drop(self, flying: deque[_Flight]) -> None:
        """Cancel what is still in flight and wait for it (its slot's file is reused next)."""
        for flight in flying:
            flight.ticket.cancel()
        for flight in flying:
            with contextlib.suppress(Exception):  # a cancelled check's failure is of no interest
                flight.result()
            self._release(flight.slot)
            self.discarded += 1
        flying.clear()


def span_cuts(low: int, high: int, ways: int) -> list[int]:
    """The points strictly between `low` and `high` that cut the span into `ways` parts (at
    least two: a bisection's middle), in order; none when nothing lies between."""
    ways = max(2, ways)
    return sorted({low + (high - low) * k // ways for k in range(1, ways)} - {low, high})
