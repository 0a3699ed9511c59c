"""Reduce the user's own script while it still fails with the same signature.

For faults the dispatcher never sees (Triton, CuPy, C++/CUDA extensions, a user's own helper),
there is no aten op to rebuild, so the program itself is cut down. `reduce_source` is the
entry: it sets up how candidates run (the oracle's fork server, or a given `check`), makes
sure the user's script fails that way to begin with (beside the first candidates when there
are several slots), runs the fixed-point loop (`reprocut.source.fixed_point`, its order
`reprocut.source.size`) and finishes the result (a sync at its end, formatted). Each accepted
script goes out through `on_event` (`reprocut.source.results`) so the caller can save it. What
reaches the failing call comes in as specs and a focus line (`reprocut.source.probe`); a
recording is turned into those by `reprocut.source.recorded`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from reprocut.check import check_log
from reprocut.check.connection import Ticket
from reprocut.check.verdicts import Cancelled
from reprocut.model.case import Signature, TensorSpec
from reprocut.model.errors import NotReproducedError
from reprocut.model.limits import CHECK_CAP
from reprocut.model.signature import is_memory_error
from reprocut.source.checks import OracleChecks, preload_imports
from reprocut.source.custom_ops import custom_op_name, registering_names
from reprocut.source.finish import ending_with_a_sync, format_code
from reprocut.source.fixed_point import Check, SourceReducer, reproduces
from reprocut.source.launch_specs import LaunchValues
from reprocut.source.passes import PASSES, PassContext, SourcePass
from reprocut.source.results import SourceAccepted, SourceEvent, SourceResult
from reprocut.source.size import count_lines, count_small_statements
from reprocut.source.speculation import CallableChecks, Checks, check_alone, default_slots
from reprocut.source.validity import Rules, reducible_files


def reduce_source(
    script_path: Path,
    *,
    cwd: Path,
    argv: Sequence[str],
    expected: Signature,
    check: Check | None = None,
    oracle: Any = None,
    max_checks: int = CHECK_CAP,
    max_time: float | None = None,
    on_event: Callable[[SourceEvent], None] | None = None,
    specs: Sequence[TensorSpec | None] = (),
    named_specs: Sequence[tuple[str, TensorSpec]] = (),
    named_values: Sequence[tuple[str, Any]] = (),
    call_values: LaunchValues | None = None,
    focus: str | None = None,
    passes: Sequence[SourcePass] = PASSES,
    timeout: float = 60.0,
    code: str | None = None,
    parallel: int | None = None,
    preload: bool = True,
    message: str | None = None,
) -> SourceResult:
    """Cut `script_path` down to a small standalone script failing with `expected`: to the
    fixed point (a round of passes that removes nothing), or `max_checks`, or `max_time` (the
    caller's limit; None: the safety cap, reprocut.model.limits).

    `check(code)` runs a candidate; without one, `oracle.check_source` does (an Oracle with its
    fork server is started, and stopped at the end, when none is given), its server having
    imported the script's installed packages (unless `preload=False`). `parallel`: candidates checked at once (default:
    1 with `check`, which must then be thread-safe to be given more; `default_slots()` with
    the oracle).
    `specs` are the tensors recorded at the failing call by argument position (`focus`: that
    line's text) and `named_specs` the tensor parameters of the function making it,
    `named_values` its plain ones (see `probe_launch`): they may replace what computed them,
    strides and storage offsets kept. `call_values`: the failing call's own plain values (its
    numbers, a launch's grid), for the jump that makes the call alone.
    `message`: the original failure's message, whose numbers every accepted candidate's relate
    as they do (default: the message of the script's own check).
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
            deferred = ()
            if preload:
                deferred = preload_imports(
                    oracle, script_path, cwd, argv, defer_dynamo=True
                ).deferred
            runner = OracleChecks(oracle, script_path, cwd=cwd, argv=argv, expected=expected,
                                  timeout=timeout, slots=parallel or default_slots(),
                                  deferred=deferred)  # fmt: skip
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
            call_values=call_values or LaunchValues(),
            focus=focus,
            passes=passes,
            runner=runner,
            message=message,
        )
        loaded = (getattr(oracle, "preloaded", None) or {}).get("loaded", ())
        return replace(result, preloaded=tuple(dict.fromkeys(loaded)))


def _finished(best: str, check: Callable[[str], Any], reducer: SourceReducer) -> str:
    """The result waiting for the GPU at its end and formatted: both in one check (a GPU
    check is seconds); each alone only if together they do not fail the same way."""
    both = format_code(ending_with_a_sync(best))
    if both == best:
        return best
    reducer.checks += 1
    if reducer.is_same_failure(check(both)):
        return both
    final = best
    for finish in (ending_with_a_sync, format_code):
        finished = finish(final)
        if finished != final and finished != both:
            reducer.checks += 1
            if reducer.is_same_failure(check(finished)):
                final = finished
    return final


def _reduce(
    original: str,
    *,
    script_path: Path,
    cwd: Path,
    expected: Signature,
    max_checks: int,
    max_time: float | None,
    on_event: Callable[[SourceEvent], None] | None,
    specs: Sequence[TensorSpec | None],
    named_specs: Sequence[tuple[str, TensorSpec]],
    named_values: Sequence[tuple[str, Any]],
    call_values: LaunchValues,
    focus: str | None,
    passes: Sequence[SourcePass],
    runner: Checks,
    message: str | None,
) -> SourceResult:
    started = time.monotonic()
    context = PassContext(
        search_dirs=tuple(dict.fromkeys((script_path.parent, cwd))),
        specs=tuple(specs),
        named_specs=tuple(named_specs),
        named_values=tuple(named_values),
        call_args=call_values.args,
        call_keywords=call_values.keywords,
        call_grid=call_values.grid,
        focus=focus,
        memory_fault=is_memory_error(expected),
        ways=max(2, runner.slots),
    )
    check = partial(check_alone, runner)
    rules = validity_rules(expected, script_path, context.search_dirs, focus)
    check_log.log("rules", reducer="source", focus=focus, memory_fault=rules.memory_fault,
                  custom_op=rules.custom_op, op_functions=list(rules.op_functions),
                  code=original)  # fmt: skip
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reprocut-original") as aside:
        beside = _OriginalBeside.start(aside, runner, original)
        first = None if beside is None else beside.future
        if first is None:
            verdict = check(original)
            if not reproduces(verdict, expected):
                raise _not_reproduced(script_path, expected)
            message = getattr(verdict, "message", "") if message is None else message
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
            rules=rules,
            stop=None if beside is None else partial(beside.stop_unless_reproduced, expected),
            message=message or "",
            message_from=first if message is None else None,
            refused=getattr(runner, "refused", None),
        )
        if beside is not None:
            reducer.on_event = beside.moot_once_one_reproduces(on_event)
        stopped = reducer.run()
        if beside is not None and reducer.best == original:
            verdict = beside.answer()
            if not reproduces(check(original) if verdict is None else verdict, expected):
                raise _not_reproduced(script_path, expected)
    # unconfirmed: repro.py's own plain runs follow at once (a confirmation started here was
    # the last thing the shrink's process waited for as it exited)
    final = _finished(reducer.best, partial(runner.run, slot=0, ticket=None), reducer)
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
        known_failures=reducer.known_failures,
    )


def validity_rules(
    expected: Signature, script_path: Path, dirs: tuple[Path, ...], focus: str | None = None
) -> Rules:
    """The rules for this failure: pointers and devices for a memory fault, the op's
    registration and call for a custom op, nothing raised before the failing line `focus`
    (reprocut.source.validity)."""
    qualified = custom_op_name(f"torch.ops.{(expected.op or '').replace('::', '.')}")
    files = [script_path, *sorted(reducible_files(script_path, dirs) - {script_path})]
    names = registering_names(qualified, files) if qualified else ()
    return Rules(memory_fault=is_memory_error(expected), custom_op=qualified, op_functions=names,
                 focus=focus)  # fmt: skip


class _OriginalBeside:
    """With several slots, the user's script is checked beside the first candidates, in a file
    of its own (on the H200 a run of the whole training script is seconds the jump to the call
    need not wait for); with one, before them (`start` gives None).

    Its answer matters only until a candidate reproduces: the reduction then goes on from that
    candidate, and the message the candidates keep was known before or waited for. So the check
    is cancelled then. On the H100 (82bf121, four shrinks at once) it ran on for 20-22 s after
    the CuPy scripts' first accepted cut, the whole training beside the reduction, and checks
    of full-size candidates that ended with it took 10.5-10.9 s, ones after it 2-6 s. Cancelled
    (8257a0d, on the H200) at 7.0-7.2 s, the full-size checks still stalled in other windows
    (faults-cuda.md): the whole training was not the only thing holding them."""

    def __init__(self, future: Future[Any], ticket: Ticket) -> None:
        self.future, self.ticket = future, ticket

    @classmethod
    def start(
        cls, aside: ThreadPoolExecutor, runner: Checks, original: str
    ) -> _OriginalBeside | None:
        if runner.slots < 2:
            return None
        slot = runner.slots  # the slot past the speculation's
        ticket = Ticket()
        return cls(
            aside.submit(lambda: runner.settle(original, slot, runner.run(original, slot, ticket))),
            ticket,
        )

    def moot_once_one_reproduces(
        self, on_event: Callable[[SourceEvent], None] | None
    ) -> Callable[[SourceEvent], None]:
        """`on_event`, cancelling the check at the first accepted candidate."""

        def forward(event: SourceEvent) -> None:
            if isinstance(event, SourceAccepted) and not self.ticket.cancelled:
                self.ticket.cancel()
                check_log.log("original_moot", reducer="source", answered=self.future.done())
            if on_event is not None:
                on_event(event)

        return forward

    def answer(self) -> Any | None:
        """The script's verdict (None: its check was cancelled; waits for one still running)."""
        verdict = self.future.result()
        return None if isinstance(verdict, Cancelled) else verdict

    def stop_unless_reproduced(self, expected: Signature) -> str | None:
        """A candidate accepted meanwhile reproduces by itself; without one there is no use going
        on once the user's script did not fail that way."""
        if not self.future.done():
            return None
        verdict = self.answer()
        if verdict is None or reproduces(verdict, expected):
            return None
        return "the original does not reproduce"


def _not_reproduced(script_path: Path, expected: Signature) -> NotReproducedError:
    return NotReproducedError(
        f"{script_path.name} does not fail with {expected.describe()}",
        hint="record it again: the failure may depend on the environment or be flaky",
    )
