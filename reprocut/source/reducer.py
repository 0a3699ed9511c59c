"""Reduce the user's own script while it still fails with the same signature.

For faults the dispatcher never sees (Triton, CuPy, C++/CUDA extensions, a user's own helper),
there is no aten op to rebuild, so the program itself is cut down: the same fixed-point loop as
the op-level shrinker, over module texts instead of ReproCases. One total order (`sort_key`)
says which script is simpler; `consider` is the only place `best` changes, checking "strictly
smaller" before paying for a run and "same signature" after; each accepted script goes out
through `on_event` so the caller can save it. A pass's `Options` run several at a time
(`reprocut.source.speculation`), their verdicts taken in the pass's order, so the result is the
one-at-a-time result. What reaches the failing call comes in as specs and a focus line
(`reprocut.source.probe`); a recording is turned into those by `reprocut.source.recorded`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import libcst as cst

from reprocut.model.case import Signature, TensorSpec
from reprocut.model.errors import NotReproducedError
from reprocut.model.signature import is_memory_error
from reprocut.source.checks import OracleChecks, preload_imports
from reprocut.source.finish import ending_with_a_sync, format_code
from reprocut.source.passes import (
    COMPOUND,
    PASSES,
    PassContext,
    SourcePass,
    calls_focus,
    integer_value,
    is_constant,
    parse,
    sibling_imports,
)
from reprocut.source.passes.tree import Options
from reprocut.source.speculation import (
    BudgetSpent,
    CallableChecks,
    Checks,
    Speculation,
    check_alone,
    default_slots,
)

# check(code) -> a Verdict from reprocut.check.oracle (anything with `.signature` that failed), or,
# for pure predicates and the fresh-process check here, the Signature seen (None: it passed).
Check = Callable[[str], Any]


# --- the size order --------------------------------------------------------------------------


class _Measure(cst.CSTVisitor):
    """Counts for the size order. A tensor built from literals counts as one node."""

    def __init__(self) -> None:
        self.compound = self.small = self.nodes = self.names = self.integers = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, COMPOUND):
            self.compound += 1
        elif isinstance(node, cst.BaseSmallStatement):
            self.small += 1
        if isinstance(node, cst.BaseExpression | cst.Arg):
            self.nodes += 1
            if is_constant(node) and isinstance(node, cst.Call):
                return False
        if isinstance(node, cst.Name):
            self.names += 1
        elif isinstance(node, cst.Integer):
            self.integers += integer_value(node)
        return True


def sort_key(code: str, search_dirs: Sequence[Path] = ()) -> tuple[int, ...]:
    """Smaller is simpler: imports of the user's own modules (a repro is one file), then
    blocks (loops, branches, functions: a flat script is simpler), non-blank lines, statements,
    expression nodes, variable names, the sum of integer constants, characters."""
    module = parse(code)
    if module is None:
        return (sys.maxsize,)
    measure = _Measure()
    module.visit(measure)
    lines = sum(1 for line in code.splitlines() if line.strip())
    return (
        len(sibling_imports(module, search_dirs)) if search_dirs else 0,
        measure.compound,
        lines,
        measure.small,
        measure.nodes,
        measure.names,
        measure.integers,
        len(code),
    )


# --- results and events ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceAccepted:
    """A smaller script that still fails the same way (the caller may save it)."""

    pass_name: str
    code: str
    lines: int
    checks: int


@dataclass(frozen=True, slots=True)
class SourceChecked:
    """One candidate was run."""

    pass_name: str
    checks: int
    accepted: bool


SourceEvent = SourceAccepted | SourceChecked


@dataclass(frozen=True, slots=True)
class SourceResult:
    code: str
    statements: int
    lines: int
    checks: int
    seconds: float
    accepted: tuple[tuple[str, int], ...]  # (pass name, accepted candidates), passes in order
    stopped: str  # "fixed point", "max checks", "max time"
    original_lines: int = 0
    parallel: int = 1  # candidates checked at once
    discarded: int = 0  # speculative checks whose verdicts were not needed (not in `checks`)
    preloaded: tuple[str, ...] = ()  # packages the fork server imported for every check


def count_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def count_small_statements(code: str) -> int:
    module = parse(code)
    if module is None:
        return 0
    measure = _Measure()
    module.visit(measure)
    return measure.small + measure.compound


# --- the loop --------------------------------------------------------------------------------


def signature_of(verdict: Any) -> Signature | None:
    """The failure a check saw: a Verdict's signature, a bare Signature, or None (passed)."""
    if verdict is None or isinstance(verdict, Signature):
        return verdict
    signature = getattr(verdict, "signature", None)
    return signature if isinstance(signature, Signature) else None


def reproduces(verdict: Any, expected: Signature) -> bool:
    """Same bug? The oracle's Verdict says so itself (Reproduced); a bare Signature from a
    plain check is compared with `expected`."""
    if isinstance(verdict, Signature):
        return verdict.matches(expected)
    if verdict is None:
        return False
    from reprocut.check.oracle import Reproduced

    return isinstance(verdict, Reproduced)


@dataclass
class SourceReducer:
    """Greedy reduction to a fixed point; `best` changes only in `consider`."""

    best: str
    expected: Signature
    check: Check
    context: PassContext
    passes: Sequence[SourcePass] = PASSES
    max_checks: int = 500
    max_time: float = 300.0
    on_event: Callable[[SourceEvent], None] | None = None
    checks: int = 0  # runs paid for so far (the caller may count its initial check)
    started: float = field(default_factory=time.monotonic)
    accepted: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set, repr=False)
    parallel: int = 1  # with `check`: run it on this many threads at once (it must allow that)
    runner: Checks | None = None  # how candidates run (default: `check`, `parallel` at a time)
    stop: Callable[[], str | None] | None = None  # a reason to stop now, asked with the budget
    _keys: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    _speculation: Speculation | None = field(default=None, repr=False)

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
        return reproduces(verdict, self.expected)

    def admissible(self, candidate: str) -> bool:
        """Worth a run: not a repeat, strictly smaller, still making the failing call."""
        if candidate in self.seen or self.key(candidate) >= self.key(self.best):
            return False
        return not self.drops_focus(candidate)

    def out_of_budget(self, in_flight: int = 0) -> str | None:
        if self.checks + in_flight >= self.max_checks:
            return "max checks"
        if time.monotonic() - self.started >= self.max_time:
            return "max time"
        return self.stop() if self.stop is not None else None

    def take(self, candidate: str, verdict: Any, pass_name: str) -> bool:
        """A candidate's verdict, in the pass's order: the only place `best` changes."""
        self.seen.add(candidate)
        self.checks += 1
        ok = self.is_same_failure(verdict)
        self._emit(SourceChecked(pass_name, self.checks, ok))
        if not ok:
            return False
        self.best = candidate
        self.accepted[pass_name] = self.accepted.get(pass_name, 0) + 1
        self._emit(SourceAccepted(pass_name, candidate, count_lines(candidate), self.checks))
        return True

    @property
    def discarded(self) -> int:
        return 0 if self._speculation is None else self._speculation.discarded

    def speculation(self) -> Speculation:
        if self._speculation is None:
            runner = self.runner or CallableChecks(self.check, self.parallel)
            self._speculation = Speculation(runner)
        return self._speculation

    def consider(self, candidate: str, pass_name: str = "") -> bool:
        """Run one candidate (if worth it); True when it became the best."""
        options = [(True, candidate)]
        return self.speculation().first_accepted(self, options, pass_name) is not None

    def run_pass(self, source_pass: SourcePass) -> None:
        name = source_pass.__name__
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

    def run(self) -> str:
        """Run every pass until a whole round changes nothing; the reason it stopped."""
        try:
            while True:
                before = self.best
                for source_pass in self.passes:
                    self.run_pass(source_pass)
                if self.best == before:
                    return "fixed point"
        except BudgetSpent as exc:
            return exc.reason
        finally:
            if self._speculation is not None:
                self._speculation.close()

    def _emit(self, event: SourceEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)


def reduce_source(
    script_path: Path,
    *,
    cwd: Path,
    argv: Sequence[str],
    expected: Signature,
    check: Check | None = None,
    oracle: Any = None,
    max_checks: int = 500,
    max_time: float = 300,
    on_event: Callable[[SourceEvent], None] | None = None,
    specs: Sequence[TensorSpec | None] = (),
    named_specs: Sequence[tuple[str, TensorSpec]] = (),
    named_values: Sequence[tuple[str, Any]] = (),
    focus: str | None = None,
    passes: Sequence[SourcePass] = PASSES,
    timeout: float = 60.0,
    code: str | None = None,
    parallel: int | None = None,
    preload: bool = True,
) -> SourceResult:
    """Cut `script_path` down to a small standalone script failing with `expected`.

    `check(code)` runs a candidate; without one, `oracle.check_source` does (an Oracle with its
    fork server is started, and stopped at the end, when none is given), its server having
    imported the script's installed packages (unless `preload=False`). `parallel`: candidates checked at once (default:
    1 with `check`, which must then be thread-safe to be given more; `default_slots()` with
    the oracle).
    `specs` are the tensors recorded at the failing call by argument position (`focus`: that
    line's text) and `named_specs` the tensor parameters of the function making it,
    `named_values` its plain ones (see `probe_launch`): they may replace what computed them,
    strides and storage offsets kept.
    Raises NotReproducedError when the script does not fail that way to begin with.
    """
    script_path = Path(script_path).resolve()
    cwd = Path(cwd).resolve()
    original = script_path.read_text() if code is None else code
    with contextlib.ExitStack() as stack:
        runner: Checks
        if check is None:
            if oracle is None:
                from reprocut.check.oracle import Oracle  # the fork server: torch imported once

                oracle = stack.enter_context(Oracle(expected, timeout=timeout))
            if preload:
                preload_imports(oracle, script_path, cwd, argv)
            runner = OracleChecks(oracle, script_path, cwd=cwd, argv=argv, expected=expected,
                                  timeout=timeout, slots=parallel or default_slots())  # fmt: skip
            stack.callback(runner.close)
        else:
            runner = CallableChecks(check, parallel or 1)
        result = _reduce(
            original,
            script_path=script_path,
            cwd=cwd,
            expected=expected,
            max_checks=max_checks,
            max_time=max_time,
            on_event=on_event,
            specs=specs,
            named_specs=named_specs,
            named_values=named_values,
            focus=focus,
            passes=passes,
            runner=runner,
        )
        loaded = (getattr(oracle, "preloaded", None) or {}).get("loaded", ())
        return replace(result, preloaded=tuple(dict.fromkeys(loaded)))


def _finished(
    best: str, check: Callable[[str], Any], expected: Signature, reducer: SourceReducer
) -> str:
    """The result waiting for the GPU at its end and formatted: both in one check (a GPU
    check is seconds); each alone only if together they do not fail the same way."""
    both = format_code(ending_with_a_sync(best))
    if both == best:
        return best
    reducer.checks += 1
    if reproduces(check(both), expected):
        return both
    final = best
    for finish in (ending_with_a_sync, format_code):
        finished = finish(final)
        if finished != final and finished != both:
            reducer.checks += 1
            if reproduces(check(finished), expected):
                final = finished
    return final


def _reduce(
    original: str,
    *,
    script_path: Path,
    cwd: Path,
    expected: Signature,
    max_checks: int,
    max_time: float,
    on_event: Callable[[SourceEvent], None] | None,
    specs: Sequence[TensorSpec | None],
    named_specs: Sequence[tuple[str, TensorSpec]],
    named_values: Sequence[tuple[str, Any]],
    focus: str | None,
    passes: Sequence[SourcePass],
    runner: Checks,
) -> SourceResult:
    started = time.monotonic()
    context = PassContext(
        search_dirs=tuple(dict.fromkeys((script_path.parent, cwd))),
        specs=tuple(specs),
        named_specs=tuple(named_specs),
        named_values=tuple(named_values),
        focus=focus,
        memory_fault=is_memory_error(expected),
    )
    check = partial(check_alone, runner)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reprocut-original") as aside:
        first = _check_original(aside, runner, original)
        if first is None and not reproduces(check(original), expected):
            raise _not_reproduced(script_path, expected)
        reducer = SourceReducer(
            best=original,
            expected=expected,
            check=check,
            context=context,
            passes=passes,
            max_checks=max_checks,
            max_time=max_time,
            on_event=on_event,
            checks=1,
            started=started,
            runner=runner,
            stop=None if first is None else partial(_stop_unless_reproduced, first, expected),
        )
        stopped = reducer.run()
        if (
            first is not None
            and reducer.best == original
            and not reproduces(first.result(), expected)
        ):
            raise _not_reproduced(script_path, expected)
    final = _finished(reducer.best, check, expected, reducer)
    return SourceResult(
        code=final,
        statements=count_small_statements(final),
        lines=count_lines(final),
        checks=reducer.checks,
        seconds=time.monotonic() - started,
        accepted=tuple((p.__name__, reducer.accepted.get(p.__name__, 0)) for p in passes),
        stopped=stopped,
        original_lines=count_lines(original),
        parallel=runner.slots,
        discarded=reducer.discarded,
    )


def _check_original(aside: ThreadPoolExecutor, runner: Checks, original: str) -> Future[Any] | None:
    """With several slots, the user's script is checked beside the first candidates, in a file
    of its own (on the H200 a run of the whole training script is seconds the jump to the call
    need not wait for); with one, before them (None)."""
    if runner.slots < 2:
        return None
    slot = runner.slots  # the slot past the speculation's
    return aside.submit(lambda: runner.settle(original, slot, runner.run(original, slot, None)))


def _not_reproduced(script_path: Path, expected: Signature) -> NotReproducedError:
    return NotReproducedError(
        f"{script_path.name} does not fail with {expected.describe()}",
        hint="record it again: the failure may depend on the environment or be flaky",
    )


def _stop_unless_reproduced(first: Future[Any], expected: Signature) -> str | None:
    """A candidate accepted meanwhile reproduces by itself; without one there is no use going
    on once the user's script did not fail that way."""
    if first.done() and not reproduces(first.result(), expected):
        return "the original does not reproduce"
    return None
