"""Localize a torchrun rank's failure by running the whole job again, that rank synchronized.

A rank that device-asserted can die before it reports (on the H200 a rank sharing the GPU over
gloo died by SIGSEGV, or SIGABRT, before its outcome was written: a gloo worker or teardown on
the broken context), or report a CUDA error that its snapshots do not explain. One process
would be rerun to the failing step, synchronizing around every op there, so that the faulting
op raises in the main thread with its inputs captured (rerun.py). A rank cannot run alone: its
collectives need its peers. So JobRerunner, the options' rerunner, runs the real torchrun again
with the same arguments, that rank localizing as a single-process rerun would (rank.py) and the
other ranks plainly, and hands rerun.py that rank's result.

The steps to synchronize come from what a dead rank left on disk: its trace, written step by
step as it ran, in which a GPU run also notes the last step whose kernels were known complete.
The window starts after that step (at most MAX_SPAN steps back; the last DEFAULT_SPAN steps
when nothing was known complete) and ends at the step the rank was in when it died.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from typing import Any

from reprocut.localize.crash import fatal_error, faulthandler_location
from reprocut.localize.failure import LocalizeOptions, Progress
from reprocut.localize.localizer import localize
from reprocut.localize.rerun import rerun
from reprocut.model.job import JobRerun, RankEnd, tail_of
from reprocut.model.recording import Failure, RunDir
from reprocut.record.parent.runner import RunResult
from reprocut.record.ranks.job import JobRequest, RankRun, RankTarget, run_job

DEFAULT_SPAN = 3  # steps synchronized when no step was known complete (CPU, or none retired)
MAX_SPAN = 8  # at most this many steps synchronized, however far back the last healthy one
FOUND = ("localized", "outside-dispatcher")  # statuses that name where the fault was


class JobRerunner:
    """Runs the job again for one localization attempt of `rank`; keeps a JobRerun of each."""

    def __init__(self, request: JobRequest, rank: int, because: str = "") -> None:
        self.request = request
        self.rank = rank
        self.because = because  # why the job runs again, for the report
        self.reruns: list[JobRerun] = []

    def describe(self, span: str) -> str:
        return (
            f"rerunning the job with rank {self.rank} synchronized at {span} "
            "(the other ranks run plainly)"
        )

    def __call__(self, attempt: str, **how: Any) -> RunResult:
        target = RankTarget(self.rank, attempt, tuple(sorted(how.items())))
        job = run_job(replace(self.request, target=target, quiet=True))
        self.reruns.append(
            JobRerun(
                rank=self.rank,
                attempt=attempt,
                first_step=how.get("localize_from"),
                last_step=how.get("localize_to"),
                because=self.because,
                returncode=job.returncode,
                seconds=round(job.seconds, 3),
                ranks=tuple(
                    RankEnd(
                        run.rank,
                        run.result.returncode,
                        run.result.signal,
                        run.result.outcome is not None,
                        tail_of(run.result.stderr),
                    )
                    for run in job.ranks.values()
                ),
            )
        )
        found = job.ranks.get(self.rank)
        if found is not None:
            return found.result
        return RunResult(  # the rank never started: torchrun's own output says why
            returncode=job.returncode,
            signal=None,
            timed_out=job.timed_out,
            seconds=job.seconds,
            stdout=job.stdout,
            stderr=job.stderr,
            outcome=None,
        )


def died_how(run: RankRun) -> str:
    """How a rank's process ended: "SIGSEGV", or "exit code 1"."""
    sig = run.result.signal
    if sig:
        try:
            return signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"
    return f"exit code {run.result.returncode}"


def crash_outcome(run: RankRun) -> dict[str, Any]:
    """What a rank that died without reporting left on disk, as the outcome rerun.py reads:
    the step it was in (its trace's completed steps), the last one known complete, its error
    and the line its crashing thread was at (faulthandler's dump)."""
    steps = [r for r in RunDir(run.folder).read_trace() if r.get("type") == "step"]
    step = len(steps)
    known = max((int(r.get("healthy_through", -1)) for r in steps), default=-1)
    healthy = max(known, step - MAX_SPAN) if known >= 0 else step - DEFAULT_SPAN
    message = f"the rank's process died ({died_how(run)}) after {step} completed step(s)"
    fatal = fatal_error(run.result.stderr)
    if fatal:
        message += f": {fatal}"
    where = faulthandler_location(run.result.stderr)  # the crashing thread's user line
    return {
        "step": step,
        "healthy_through": max(healthy, -1),
        "error": {"type": "Crash", "message": message, "code": None},
        "surfaced_at": None if where is None else where.to_json(),
        "snapshots": [],
        "culprit": None,
    }


def localize_rank(options: LocalizeOptions, run: RankRun, progress: Progress) -> Failure:
    """The culprit rank's Failure: from its own recording, and where that is not enough (no
    outcome, or a CUDA error that nothing in it explains) from a rerun of the job, if the
    options have a JobRerunner."""
    rerunner = options.rerunner
    if run.result.outcome is not None or not isinstance(rerunner, JobRerunner):
        if isinstance(rerunner, JobRerunner):
            rerunner.because = f"rank {run.rank}'s own recording did not name the op that faulted"
        return localize(options, run.result, progress)
    why = f"rank {run.rank} died before reporting ({died_how(run)})"
    rerunner.because = why
    outcome = crash_outcome(run)
    # the crash as the first run saw it (its signal, faulthandler's line), read before the
    # rerun adds its own steps to the rank's trace
    crashed = localize(replace(options, rerun=False, rerunner=None), run.result, progress)
    failure = rerun(options, run.result, outcome, progress, why=why)
    if failure.status in FOUND:
        return failure
    return crashed.with_notes(*failure.notes)
