"""From a failed run to the first faulting op, its real inputs and a Failure on disk.

The first run's traceback is not evidence on CUDA: errors surface asynchronously at a later op.
In order of cost:
1. in-process: the op raised synchronously (CPU, or a fault caught in a synchronized step);
2. snapshot replay: the asserting ops of the failing step, whose evidence was copied to host
   before they ran, are replayed one at a time in fresh children; the first that faults is it;
3. rerun: the script runs again to the failing step, synchronizing around each op of that step;
   a fault pending *before* an op came from outside the dispatcher, and a blocking rerun then
   names the Python line that launched the custom kernel.
An out-of-memory failure gets a MemoryReport from a rerun under the memory watch (memory.py).
A NaN or inf (a `--nan` run's flag flipped, or the failure's inputs held one) is traced to the
op that made it by one more rerun (nonfinite.py).
"""

from __future__ import annotations

from typing import Any

from reprocut.localize.crash import fatal_error, faulthandler_location
from reprocut.localize.culprit import from_culprit, names_op, names_public_call
from reprocut.localize.failure import (
    LocalizeOptions,
    Progress,
    error_info,
    finish,
    not_localized,
    script_error,
)
from reprocut.localize.memory import (
    is_oom_failure,
    is_oom_outcome,
    oom_in_light_step,
    with_memory,
)
from reprocut.localize.nonfinite import flagged_step, trace_origin, wants_origin
from reprocut.localize.replay import replay_snapshots
from reprocut.localize.rerun import rerun, rerun_for_op
from reprocut.model.errors import ScriptDidNotFailError, ScriptTimeoutError
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.model.signature import (
    crash_signature,
    is_cuda_failure,
    parse_assertions,
    signal_name,
)
from reprocut.record.parent.runner import RunResult


def localize(options: LocalizeOptions, first: RunResult, progress: Progress) -> Failure:
    """Turn the first run's result into a Failure (written to the run dir), or raise."""
    step = flagged_step(first.outcome) if options.nan and not first.timed_out else None
    if step is not None:
        progress(f"a NaN or inf appeared at step {step}; finding the op that made it")
        return trace_origin(options, first, step, None, progress)
    try:
        failure = _localize_error(options, first, progress)
    except ScriptDidNotFailError as exc:
        if options.nan:
            raise ScriptDidNotFailError(
                "the script finished without error, and no NaN or inf reached its losses, "
                "gradients, parameters or model outputs",
                hint=exc.hint,
            ) from None
        raise
    if is_oom_failure(failure) and failure.memory is None and options.rerun:
        failure = with_memory(options, failure, progress, first.seconds)
    if wants_origin(failure):
        progress("NaN/inf in what failed; finding the op that made it")
        origin_step = failure.step if failure.step is not None else first.outcome["step"]
        return trace_origin(options, first, origin_step, failure, progress)
    return failure


def _localize_error(options: LocalizeOptions, first: RunResult, progress: Progress) -> Failure:
    outcome = first.outcome
    if first.timed_out:
        steps = sum(1 for r in options.run_dir.read_trace() if r.get("type") == "step")
        raise ScriptTimeoutError(
            f"the script ran past --timeout {options.timeout:g}s (completed {steps} step(s))",
            hint="raise --timeout if it is just slow; a hang after a CUDA error is common, and "
            "`reprocut record --launch-blocking` often turns it into a clean error",
        )
    if outcome is None:
        return _crashed(options, first, progress)
    if outcome["status"] in ("passed", "exited") and outcome.get("exit_code", 0) == 0:
        raise ScriptDidNotFailError(
            "the script finished without error: nothing to reproduce",
            hint="check the arguments (the failing epoch/step, the --device), or whether the "
            "failure is flaky",
        )
    if outcome["status"] == "exited":
        return script_error(
            options,
            first,
            ErrorInfo("SystemExit", f"the script exited with code {outcome['exit_code']}"),
            None,
        )
    error = outcome["error"]
    culprit = outcome.get("culprit")
    cuda = is_cuda_failure(error["type"], error["message"], error.get("code"))
    unwatched = _raise_unwatched(outcome)
    if names_op(culprit) and not (outcome.get("raise_missed") and options.rerun):
        return from_culprit(options, first, outcome, culprit, first, "in-process")
    if is_oom_outcome(outcome) and (unwatched or cuda) and options.rerun:
        # an allocation failure is its op's own, even one reading as a CUDA error (cuBLAS's)
        return oom_in_light_step(options, first, outcome, progress)
    if not cuda and unwatched and options.rerun:
        return rerun_for_op(options, first, outcome, progress)
    if names_public_call(culprit):
        return from_culprit(options, first, outcome, culprit, first, "in-process")
    if not cuda:
        return script_error(options, first, error_info(error, first.stderr), outcome)
    progress(f"CUDA error surfaced at step {outcome['step']}; finding the op that faulted")
    if options.snapshots and outcome.get("snapshots"):
        found = replay_snapshots(options, first, outcome, progress)
        if found is not None:
            return found
    if not options.rerun:
        return not_localized(options, first, outcome, "localization rerun disabled (--no-rerun)")
    return rerun(options, first, outcome, progress)


def _raise_unwatched(outcome: dict[str, Any]) -> bool:
    """The error met a light step that did not see the op raise as a full trace does: a GPU
    run's (only the asserting ops seen), or a CPU run's whose raising call could not be watched
    again (a backward; record/inside/raise_watch.py). A rerun of that step watches every op."""
    if outcome.get("raise_missed"):
        return True
    return bool(outcome.get("light_step")) and not outcome.get("raise_watched")


def _crashed(options: LocalizeOptions, first: RunResult, progress: Progress) -> Failure:
    steps = [r for r in options.run_dir.read_trace() if r.get("type") == "step"]
    completed = len(steps)
    signature = crash_signature(-first.signal if first.signal else first.returncode or 0)
    name = signal_name(-first.signal) if first.signal else ""
    how = f"{signature.kind}, {name}" if name else signature.kind
    fatal = fatal_error(first.stderr)
    assertions = parse_assertions(first.stderr)
    message = f"the script's process died ({how}) after {completed} completed step(s)"
    if fatal:
        message += f": {fatal}"
    where = faulthandler_location(first.stderr)
    error = ErrorInfo(
        type="Crash", message=message, assertions=tuple(a.to_json() for a in assertions)
    )
    if assertions and options.rerun:
        progress(f"{message}; kernel assertions on stderr: rerunning to step {completed}")
        fake_outcome = {
            "step": completed,
            "error": {"type": "Crash", "message": message},
            "snapshots": [],
        }
        return rerun(options, first, fake_outcome, progress)
    return finish(
        options,
        Failure(
            status="not-localized",
            error=error,
            signature=signature,
            step=completed,
            source=where,  # the crashing thread's innermost user frame, from faulthandler
            surfaced_at=where,
            localization="none",
            notes=(f"the trace holds the {completed} completed step(s) before the crash",),
        ),
    )
