"""Run the script again to the failing step, synchronizing around each op there: one rerun.

Takes the first run's outcome (the failing step, the last step known healthy); hands on the
Failure for the op the rerun names, else, when the fault was pending before an op or raised
outside any (a custom kernel), the launch line and what reached it, from the same rerun: it
launches with CUDA_LAUNCH_BLOCKING=1 and waits for the GPU after each line of the user's code
in those steps (line_sync), reading the launch's inputs as it goes (launch_read). A synchronous
error in a light step is rerun here too, watching every op of that step. Under torchrun the
options' rerunner runs the whole job again instead, the culprit rank localizing (job_rerun.py).
"""

from __future__ import annotations

from typing import Any

from reprocut.localize.culprit import from_culprit, names_op, names_public_call
from reprocut.localize.failure import (
    LocalizeOptions,
    Progress,
    error_info,
    not_localized,
    script_error,
)
from reprocut.localize.launch import outside_dispatcher
from reprocut.model.recording import Failure
from reprocut.record.parent.runner import RunRequest, RunResult, run_script

_RERUN_FACTOR, _RERUN_SLACK = 3.0, 60.0  # a rerun's limit: 3x the first run's time + 60 s


def rerun(
    options: LocalizeOptions,
    first: RunResult,
    outcome: dict[str, Any],
    progress: Progress,
    why: str = "",
) -> Failure:
    """`why`, if given, starts the progress line: what made the rerun necessary."""
    step = outcome["step"]
    first_suspect = min(step, outcome.get("healthy_through", step - 1) + 1)
    span = f"step {step}" if first_suspect == step else f"steps {first_suspect}-{step}"
    if options.rerunner is not None:
        line = options.rerunner.describe(span)
    else:
        line = (
            f"rerunning to {span} with CUDA_LAUNCH_BLOCKING=1, synchronizing around each op "
            "and each line of your code there"
        )
    progress(f"{why}; {line}" if why else line)
    second, limit = _run_again(
        options, "localize", first.seconds, **localizing(first_suspect, step)
    )
    again = second.outcome
    if again is None or again.get("status") != "failed":
        why = ended_why(second, limit)
        return not_localized(
            options, first, outcome, f"the localization rerun to step {step}: {why}"
        )
    culprit = again.get("culprit")
    if names_op(culprit):
        return from_culprit(options, first, outcome, culprit, second, "rerun")
    # A fault pending before an aten op, or raised outside any: a custom kernel, whose launch
    # line the same rerun named (and read what reached it).
    return outside_dispatcher(options, first, outcome, again, second, progress)


def localizing(first_step: int, last_step: int) -> dict[str, Any]:
    """How the one localization rerun runs (the RunRequest fields): synchronized around each
    op of the suspect steps, so an aten op that faults raises at itself; with blocking launches
    and a wait after each user line there, so a custom kernel's fault shows at its launch line,
    whose inputs are read in the same run."""
    return {"localize_from": first_step, "localize_to": last_step, "launch_blocking": True,
            "sync_lines": True}  # fmt: skip


def rerun_limit(timeout: float | None, first_seconds: float | None) -> float | None:
    """A rerun's time limit: what it watches costs a Python call per op (or a wait per op and
    line), so three times the first run's time and a minute more; never past the user's
    --timeout. A rerun can hang where the first run did not (a lock its killed process left)."""
    bound = None if first_seconds is None else _RERUN_FACTOR * first_seconds + _RERUN_SLACK
    if timeout is None:
        return bound
    return timeout if bound is None else min(timeout, bound)


def ended_why(run: RunResult, limit: float | None) -> str:
    """Why a rerun gave no outcome, in words for a not-localized Failure."""
    if run.timed_out:
        return f"it did not end within {limit:g} s and was stopped" if limit else "it timed out"
    return "it crashed" if run.outcome is None else "it did not fail"


def _run_again(
    options: LocalizeOptions, attempt: str, first_seconds: float | None, **how: Any
) -> tuple[RunResult, float | None]:
    """Run the script again for localization (no snapshots), within rerun_limit of the first
    run's `first_seconds`; `how` holds the RunRequest fields that make this attempt what it is
    (the steps to synchronize in, blocking launches, ...). The run and its limit."""
    limit = rerun_limit(options.timeout, first_seconds)
    if options.rerunner is not None:
        return options.rerunner(attempt, **how), options.timeout
    return run_script(
        RunRequest(
            options.script,
            options.argv,
            options.run_dir.path,
            attempt,
            snapshots=False,
            timeout=limit,
            cwd=options.cwd,
            launch=options.launch,
            **how,
        )
    ), limit


def rerun_for_op(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], progress: Progress
) -> Failure:
    """A synchronous error in a light step that did not see it as a full trace does (only
    asserting ops watched; on CPU, a raising backward that cannot run twice): the step is run
    again under the dispatch mode and the public-call mode to name the op, or the public call,
    that raised. Where the rerun names neither, the first run's culprit, if it had one."""
    step = outcome["step"]
    what = (
        "whose raising call could not be watched again (a backward, or a call that did not fail alike when run again)"
        if outcome.get("raise_missed")
        else "which recorded only the ops that can device-assert"
    )
    progress(f"an error at step {step}, {what}; rerunning that step watching every op")
    second, _ = _run_again(options, "localize", first.seconds, localize_from=step, localize_to=step)
    again = second.outcome
    culprit = again.get("culprit") if again else None
    if names_op(culprit) or names_public_call(culprit):
        return from_culprit(options, first, outcome, culprit, second, "rerun")
    known = outcome.get("culprit")
    if names_op(known) or names_public_call(known):
        return from_culprit(options, first, outcome, known, first, "in-process")
    return script_error(options, first, error_info(outcome["error"], first.stderr), outcome)
