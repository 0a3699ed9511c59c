"""The fixed-point loop of the source reducer: every pass, again, until a round changes nothing.

The same greedy loop as the op-level shrinker, over module texts instead of ReproCases.
`SourceReducer` holds the best script and its bookkeeping (the budget, the texts already
tried, the accepted count per pass) and is the one place the best changes (forward in `take`,
back in `roll_back` when a plain run beside the reduction refuses an accepted candidate): `admissible` checks
"strictly smaller" (`reprocut.source.size`) before a run is paid for, `take` checks "same
failure" after. A pass's `Options` run several at a time (`reprocut.source.speculation`),
their verdicts taken in the pass's order; those beside a taken one that reproduced too are
tried together next (merged), so one check may take what a chain of them would. Setting
the checks up and finishing the result is `reprocut.source.reducer`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from reprocut.check import check_log
from reprocut.model.case import Signature
from reprocut.model.limits import CHECK_CAP, FIXED_POINT, MAX_CHECKS, TimeLimit
from reprocut.model.signature import NUMBER, same_numbers
from reprocut.source.failed_prefix import FailedPrefixes
from reprocut.source.passes import PASSES, PassContext, SourcePass, calls_focus
from reprocut.source.passes.tree import Options
from reprocut.source.results import SourceAccepted, SourceChecked, SourceEvent, SourceRound
from reprocut.source.size import count_lines, sort_key
from reprocut.source.speculation import BudgetSpent, CallableChecks, Checks, Speculation
from reprocut.source.validity import Rules, sibling_text

# check(code) -> a Verdict from reprocut.check.oracle (anything with `.signature` that failed), or,
# for pure predicates and fresh-process checks, the Signature seen (None: it passed).
Check = Callable[[str], Any]


def signature_of(verdict: Any) -> Signature | None:
    """The failure a check saw: a Verdict's signature, a bare Signature, or None (passed)."""
    if verdict is None or isinstance(verdict, Signature):
        return verdict
    signature = getattr(verdict, "signature", None)
    return signature if isinstance(signature, Signature) else None


def reproduces(verdict: Any, expected: Signature, message: str = "") -> bool:
    """Same bug? The oracle's Verdict says so itself (Reproduced); a bare Signature from a
    plain check is compared with `expected`. `message`: the original failure's: where the kind
    is read from the message (its numbers left out), a verdict's numbers must relate as its do
    (`same_numbers`: "size 0" is an empty buffer, another bug in the same words)."""
    if isinstance(verdict, Signature):
        return verdict.matches(expected)
    if verdict is None:
        return False
    from reprocut.check.oracle import Reproduced

    if not isinstance(verdict, Reproduced):
        return False
    if not message or NUMBER not in expected.kind:  # a kind of its own (an assertion, OOM)
        return True
    return same_numbers(message, verdict.message)


@dataclass
class SourceReducer:
    """Greedy reduction to a fixed point; `best` changes only in `consider`."""

    best: str
    expected: Signature
    check: Check
    context: PassContext
    passes: Sequence[SourcePass] = PASSES
    max_checks: int = CHECK_CAP
    max_time: float | None = None  # the user's limit; None: the safety cap
    on_event: Callable[[SourceEvent], None] | None = None
    checks: int = 0  # runs paid for so far (the caller may count its initial check)
    started: float = field(default_factory=time.monotonic)
    accepted: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set, repr=False)
    parallel: int = 1  # with `check`: run it on this many threads at once (it must allow that)
    merge: bool = True  # candidates that reproduce beside a taken one are tried together next
    runner: Checks | None = None  # how candidates run (default: `check`, `parallel` at a time)
    stop: Callable[[], str | None] | None = None  # a reason to stop now, asked with the budget
    rules: Rules | None = None  # static validity rules (reprocut.source.validity)
    message: str = ""  # the original failure's message: candidates keep how its numbers relate
    # the original's check beside the first candidates, when `message` is to come from it: the
    # first verdict taken waits for it, so the result is the one-at-a-time one
    message_from: Future[Any] | None = field(default=None, repr=False)
    # a candidate accepted earlier whose plain run, beside the reduction since, did not
    # reproduce (reprocut.check.agreement); `True`: wait for the run still going
    refused: Callable[[bool], str | None] | None = None
    rejected: dict[str, int] = field(default_factory=dict)  # by the validity rules, by rule
    # the code before a statement that raised another failure: a candidate beginning with it
    # raises there too (reprocut.source.failed_prefix)
    failed: FailedPrefixes = field(default_factory=FailedPrefixes, repr=False)
    known_failures: int = 0  # candidates not run for that
    current_pass: str = ""
    _keys: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    _speculation: Speculation | None = field(default=None, repr=False)
    _lines: tuple[str, int] | None = field(default=None, repr=False)
    _history: list[str] = field(default_factory=list, repr=False)  # the bests, in order
    _round_start: str = field(default="", repr=False)  # the best as this round began

    def key(self, code: str) -> tuple[int, ...]:
        """`sort_key`, once per text (the best is compared with every candidate)."""
        found = self._keys.get(code)
        if found is None:
            found = self._keys[code] = sort_key(code, self.context.search_dirs)
        return found

    def drops_focus(self, candidate: str) -> bool:
        """Would the candidate lose the failing call (the launch) the best still makes? A repro
        must keep calling the kernel or helper that failed, not re-raise its error by hand."""
        focus = self.context.focus
        return bool(calls_focus(self.best, focus)) and calls_focus(candidate, focus) is False

    def is_same_failure(self, verdict: Any) -> bool:
        if self.message_from is not None:
            original, self.message_from = self.message_from.result(), None
            if reproduces(original, self.expected):
                self.message = getattr(original, "message", "") or ""
        return reproduces(verdict, self.expected, self.message)

    def admissible(self, candidate: str, pass_name: str | None = None) -> bool:
        """Worth a run: not a repeat, strictly smaller, still making the failing call, breaking
        no validity rule the best keeps (reprocut.source.validity), and not beginning with the
        code up to where a checked candidate raised another failure (`failed`). `pass_name`:
        the pass that made it (default: the one running)."""
        if candidate in self.seen or self.key(candidate) >= self.key(self.best):
            return False
        if self.drops_focus(candidate):
            return False
        broken = self.breaks_rule(candidate, pass_name)
        if broken is not None:
            self.seen.add(candidate)
            self.rejected[broken] = self.rejected.get(broken, 0) + 1
            return False
        if self.failed.covers(candidate):
            self.seen.add(candidate)
            self.known_failures += 1
            check_log.log(
                "known_failure", reducer="source", pass_name=pass_name or self.current_pass
            )
            return False
        return True

    def breaks_rule(self, candidate: str, pass_name: str | None = None) -> str | None:
        """The first validity rule the candidate breaks that the best keeps (None: none)."""
        rules = self.rules
        if rules is None:
            return None
        dirs = self.context.search_dirs
        extra = (  # the siblings only matter to the custom-op rule: read only for it
            (sibling_text(candidate, dirs), sibling_text(self.best, dirs))
            if rules.custom_op
            else ("", "")
        )
        name = self.current_pass if pass_name is None else pass_name
        return rules.first_broken(candidate, self.best, extra=extra, pass_name=name)

    def out_of_budget(self, in_flight: int = 0) -> str | None:
        if self.checks + in_flight >= self.max_checks:
            return MAX_CHECKS
        limit = TimeLimit.from_option(self.max_time)
        if time.monotonic() - self.started >= limit.seconds:
            return limit.reason
        return self.stop() if self.stop is not None else None

    def take(self, candidate: str, verdict: Any, pass_name: str) -> bool:
        """A candidate's verdict, in the pass's order: the only place `best` changes."""
        self.seen.add(candidate)
        self.checks += 1
        ok = self.is_same_failure(verdict)
        if not ok:
            self.failed.add(candidate, verdict, best=self.best)
        if ok:
            if not self._history:
                self._history.append(self.best)
            self.best = candidate
            self._history.append(candidate)
            self.accepted[pass_name] = self.accepted.get(pass_name, 0) + 1
        lines = self.best_lines()
        self._emit(SourceChecked(pass_name, self.checks, ok, lines))
        if ok:
            check_log.log("accepted", reducer="source", pass_name=pass_name, checks=self.checks,
                          lines=lines, code=candidate)  # fmt: skip
            self._emit(SourceAccepted(pass_name, candidate, lines, self.checks))
        return ok

    def best_lines(self) -> int:
        """The best script's lines (counted once per best: every check reports them)."""
        if self._lines is None or self._lines[0] is not self.best:
            self._lines = (self.best, count_lines(self.best))
        return self._lines[1]

    @property
    def discarded(self) -> int:
        return 0 if self._speculation is None else self._speculation.discarded

    def speculation(self) -> Speculation:
        if self._speculation is None:
            runner = self.runner or CallableChecks(self.check, self.parallel)
            self._speculation = Speculation(runner, merge=self.merge)
        return self._speculation

    def consider(self, candidate: str, pass_name: str = "") -> bool:
        """Run one candidate (if worth it); True when it became the best."""
        options = [(True, candidate)]
        accepted = self.speculation().first_accepted(self, options, pass_name, merge=False)
        return accepted is not None

    def upcoming(self) -> Iterator[tuple[str, str]]:
        """(pass name, candidate): the first candidates of the passes after the running one,
        made from the best as it is now; then, once this round has changed the best (another
        round follows), those of the passes before it. What idle slots check ahead."""
        names = [p.__name__ for p in self.passes]
        at = names.index(self.current_pass) if self.current_pass in names else len(names)
        later = list(self.passes[at + 1 :])
        if self.best != self._round_start:
            later += self.passes[:at]
        return _first_candidates(later, self.best, self.context)

    def run_pass(self, source_pass: SourcePass) -> None:
        name = self.current_pass = source_pass.__name__
        check_log.log("pass", reducer="source", pass_name=name, checks=self.checks,
                      lines=self.best_lines())  # fmt: skip
        generator = source_pass(self.best, self.context)
        try:
            step = next(generator)
            while True:
                if isinstance(step, Options):
                    answer: Any = self.speculation().first_accepted(self, step.items, name)
                else:
                    answer = self.consider(step, name)
                step = generator.send(answer)
        except StopIteration:
            return
        finally:
            generator.close()
            if self._speculation is not None:
                self._speculation.forget_merged()

    def run(self) -> str:
        """Run every pass until a whole round changes nothing; the reason it stopped."""
        try:
            while True:
                before, went_back = self.best, False
                self._round_start = before
                for source_pass in self.passes:
                    self.run_pass(source_pass)
                    went_back = self.roll_back() or went_back
                if self.best == before and not went_back and not self.roll_back(wait=True):
                    return FIXED_POINT
                self._emit(SourceRound(self.current_pass, self.checks, self.best_lines()))
        except BudgetSpent as exc:
            return exc.reason
        finally:
            if self._speculation is not None:
                self._speculation.close()

    def roll_back(self, wait: bool = False) -> bool:
        """Back to the best before each candidate a late plain run refused, which is never
        tried again; the ones accepted after it (made from it) may be, on their own merits.
        True when the best went back."""
        rolled = False
        while self.refused is not None and (code := self.refused(wait)) is not None:
            if code in self._history[1:]:
                index = self._history.index(code)
                self.best = self._history[index - 1]
                self.seen.difference_update(self._history[index + 1 :])
                del self._history[index:]
                rolled = True
                check_log.log("refused", reducer="source", lines=self.best_lines())
            self.seen.add(code)
        return rolled

    def _emit(self, event: SourceEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)


def _first_candidates(
    passes: Sequence[SourcePass], code: str, context: PassContext
) -> Iterator[tuple[str, str]]:
    """Each pass's first candidates on `code`, in order: its first Options (or candidate)."""
    for source_pass in passes:
        generator = source_pass(code, context)
        try:
            step = next(generator, None)
            items = step.items if isinstance(step, Options) else [(True, step)]
            for _, candidate in items:
                if candidate is not None:
                    yield source_pass.__name__, candidate
        finally:
            generator.close()
