"""Which rank of a torchrun job faulted first, what every other rank saw, and the culprit's
first faulting op.

torchrun names as "root cause" the rank that exited first (to the second), which is often a
victim: once a rank dies, its peers fail in the next collective ("Connection closed by peer",
NCCL errors, timeouts) or are stopped by torchrun (SIGTERM). Here each rank's own recording is
the evidence: what ended it (a torch op or CUDA error, kernel assertions on its stderr, a crash,
a plain error; or a collective that lost a peer, a stop) and when, by its own clock. The culprit
is the first rank that failed on its own; ranks that only failed in a collective or were stopped
afterwards are consequences. The culprit's recording is then localized exactly as one process's
(in-process, snapshot replay; a rerun runs the whole job again, job_rerun.py), and the Failure
carries one RankSummary per rank, with the end of its stderr.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace
from typing import Any

from reprocut.localize.culprit import names_op, names_public_call
from reprocut.localize.failure import LocalizeOptions, Progress, error_info, finish
from reprocut.localize.job_rerun import JobRerunner, localize_rank
from reprocut.model.case import Signature
from reprocut.model.errors import ReprocutError, ScriptDidNotFailError, ScriptTimeoutError
from reprocut.model.job import RankSummary, tail_of
from reprocut.model.recording import Failure, RunDir
from reprocut.model.signature import is_cuda_failure, normalize_message, parse_assertions
from reprocut.record.ranks.job import JobResult, RankRun

OWN_FAILURES = ("fault", "crash", "error", "exited")  # in this order when two tie in time
_COLLECTIVE = re.compile(
    r"connection (closed|reset|refused)|broken pipe|\bgloo\b|nccl|processgroup|c10d|"
    r"collective operation|watchdog|timed out|\bDist\w*Error",
    re.IGNORECASE,
)
_COLLECTIVE_TYPES = {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"}
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.DOTALL)
_PATH_PREFIX = re.compile(r"^\[[^\]]*\.\w+:\d+\]\s*")  # gloo's "[.../pair.cc:553] "


class TorchrunFailedError(ReprocutError):
    slug = "torchrun-failed"


@dataclass(frozen=True, slots=True)
class RankEvidence:
    """What ended one rank, read from its own recording."""

    run: RankRun
    kind: str  # see RankSummary.kind
    error: str  # one line
    time: float  # when it failed, by its own clock (inf if it never did)
    key: tuple[str, ...] = ()  # equal for ranks that failed the same way

    @property
    def rank(self) -> int:
        return self.run.rank

    @property
    def step(self) -> int | None:
        outcome = self.run.result.outcome
        if outcome is not None and outcome.get("step") is not None:
            return int(outcome["step"])
        steps = sum(1 for r in RunDir(self.run.folder).read_trace() if r.get("type") == "step")
        return steps


def is_collective_error(error_type: str, text: str) -> bool:
    return error_type in _COLLECTIVE_TYPES or bool(_COLLECTIVE.search(text))


def _one_line(error_type: str, message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = _PATH_PREFIX.sub("", first)
    if len(first) > 80:
        first = first[:77] + "..."
    return f"{error_type}: {first}" if first else error_type


def evidence(run: RankRun, job_timed_out: bool = False) -> RankEvidence:
    """Classify how one rank ended."""
    result, record, outcome = run.result, run.record, run.result.outcome
    stderr = result.stderr
    asserted = bool(parse_assertions(stderr))
    ended = record.get("ended") or record.get("terminated_at") or float("inf")
    if outcome is None:
        stopped = record.get("terminated_by")
        sig = result.signal
        if asserted:
            return RankEvidence(run, "fault", "kernel assertion on its stderr, then died", ended)
        if stopped or sig in (signal.SIGTERM, signal.SIGKILL) or record.get("ended") is None:
            kind = "timeout" if job_timed_out else "terminated"
            how = f"stopped by torchrun ({stopped})" if stopped else "killed"
            if job_timed_out:
                how = "still running at --timeout: ended by reprocut"
            return RankEvidence(run, kind, how, record.get("terminated_at") or ended)
        if is_collective_error("", stderr[-4000:]):
            return RankEvidence(run, "collective", "died after a collective error", ended)
        how = (
            f"died by {signal.Signals(sig).name}"
            if sig
            else f"exited with code {result.returncode} without a Python error"
        )
        return RankEvidence(run, "crash", how, ended, ("crash", how))
    status = outcome.get("status")
    if status in ("passed", "exited") and outcome.get("exit_code", 0) == 0:
        return RankEvidence(run, "passed", "finished without error", float("inf"))
    if status == "exited":
        how = f"exited with code {outcome.get('exit_code')}"
        kind = "collective" if is_collective_error("", stderr[-4000:]) else "exited"
        return RankEvidence(run, kind, how, ended, ("exited", how))
    error = outcome["error"]
    when = outcome.get("failed_at") or ended
    line = _one_line(error["type"], error["message"])
    culprit = outcome.get("culprit")
    op = (culprit or {}).get("op") or (culprit or {}).get("public_call") or ""
    key = (error["type"], normalize_message(error["message"]), op)
    if outcome.get("interrupted"):
        return RankEvidence(run, "terminated", "interrupted", when)
    if asserted or is_cuda_failure(error["type"], error["message"], error.get("code")):
        return RankEvidence(run, "fault", line, when, key)
    if is_collective_error(error["type"], error["message"]):
        return RankEvidence(run, "collective", line, when, key)
    if names_op(culprit) or names_public_call(culprit):
        return RankEvidence(run, "fault", line, when, key)
    return RankEvidence(run, "error", line, when, key)


def choose_culprit(ranks: list[RankEvidence]) -> RankEvidence | None:
    """The first rank that failed on its own; failing that, the first that failed at all."""
    own = [e for e in ranks if e.kind in OWN_FAILURES]
    if own:
        return min(own, key=lambda e: (e.time, OWN_FAILURES.index(e.kind), e.rank))
    failed = [e for e in ranks if e.kind not in ("passed", "missing")]
    return min(failed, key=lambda e: (e.time, e.rank)) if failed else None


def summarize(
    ranks: list[RankEvidence], culprit: RankEvidence, world_size: int | None
) -> tuple[RankSummary, ...]:
    summaries = {}
    for e in ranks:
        if e is culprit:
            role = "culprit"
        elif e.kind == "passed":
            role = "passed"
        elif e.kind in OWN_FAILURES and culprit.kind in OWN_FAILURES:
            role = "same-failure" if e.key and e.key == culprit.key else "own-failure"
        else:
            role = "consequence" if culprit.kind in OWN_FAILURES else "unknown"
        after = e.time - culprit.time if e.time != float("inf") else None
        summaries[e.rank] = RankSummary(
            e.rank,
            e.kind,
            role,
            e.step,
            e.error,
            None if after is None else round(after, 3),
            tail_of(e.run.result.stderr),
        )
    for rank in range(world_size or 0):
        if rank not in summaries:
            summaries[rank] = RankSummary(
                rank, "missing", "unknown", None, "no recording of this rank in the run folder"
            )
    return tuple(summaries[r] for r in sorted(summaries))


def torchrun_root_cause(stderr: str) -> int | None:
    """The rank torchrun's error summary names as the root cause (by exit time)."""
    match = _ROOT_CAUSE.search(stderr)
    return int(match.group(1)) if match else None


def localize_job(
    job: JobResult, options: LocalizeOptions, progress: Progress, notes: list[str]
) -> Failure:
    """The culprit rank's Failure, carrying every rank's summary (written to both folders)."""
    if not job.ranks:
        tail = "\n".join(job.stderr.strip().splitlines()[-5:])
        raise TorchrunFailedError(
            f"torchrun exited with code {job.returncode} before any rank started:\n{tail}",
            hint="run the torchrun command without reprocut: it must start its ranks",
        )
    ranks = [evidence(run, job.timed_out) for run in job.ranks.values()]
    culprit = choose_culprit(ranks)
    world = job.world_size
    if culprit is None:
        if job.timed_out:
            raise _timeout(job, ranks, options)
        raise ScriptDidNotFailError(
            f"every rank of the job ({len(ranks)} of {world}) finished without error: "
            "nothing to reproduce",
            hint="check the arguments (the failing epoch/step), or whether the failure is flaky",
        )
    if job.timed_out and culprit.kind not in OWN_FAILURES:
        raise _timeout(job, ranks, options)
    summaries = summarize(ranks, culprit, world)
    progress(f"rank {culprit.rank} failed first ({culprit.error}); localizing its failure")
    run_dir = RunDir(culprit.run.folder)
    frameworks = ((culprit.run.result.outcome or {}).get("frameworks") or {}).items()
    no_rerun = _no_rerun(job, options)
    rerunner = None
    if no_rerun is None and job.request is not None:
        rerunner = JobRerunner(job.request, culprit.rank)
    rank_options = replace(
        options,
        run_dir=run_dir,
        frameworks=tuple(frameworks),
        rerun=rerunner is not None,  # never a single-process rerun of one rank's script
        rerunner=rerunner,
    )
    if culprit.kind in OWN_FAILURES:
        failure = localize_rank(rank_options, culprit.run, progress)
    else:
        failure = _no_own_failure(rank_options, culprit)
    notes = [*notes, *_job_notes(job, culprit)]
    if failure.status == "not-localized" and no_rerun is not None:
        notes.append(no_rerun)
    failure = replace(
        failure,
        rank=culprit.rank,
        world_size=world,
        ranks=summaries,
        job_reruns=() if rerunner is None else tuple(rerunner.reruns),
    ).with_notes(*notes)
    run_dir.write_failure(failure)
    options.run_dir.write_failure(failure)
    return failure


def _no_rerun(job: JobResult, options: LocalizeOptions) -> str | None:
    """Why the job may not run again to localize its culprit rank's failure, or None."""
    torchrun = job.request.launch.torchrun if job.request is not None else None
    if not options.rerun:
        return "reruns are off (--no-rerun): a rerun of the whole job may localize it"
    if torchrun is None:
        return "the job cannot be run again from here"
    if torchrun.multi_node:
        return (
            "a multi-node job is not run again to localize (every node would have to): "
            "reproduce it on one node to have the job rerun"
        )
    return None


def _job_notes(job: JobResult, culprit: RankEvidence) -> list[str]:
    notes = []
    named = torchrun_root_cause(job.stderr)
    if named is not None and named != culprit.rank:
        notes.append(
            f"torchrun named rank {named} as the root cause (the first to exit); by the ranks' "
            f"own evidence it was rank {culprit.rank}"
        )
    if job.timed_out:
        notes.append("the job then hung until --timeout; reprocut ended every rank")
    if job.restarts:
        notes.append(
            f"torchrun restarted the job {job.restarts} time(s) anyway; the first attempt is "
            "reported (later ones are under restarts/)"
        )
    if job.world_size and len(job.ranks) < job.world_size:
        notes.append(
            f"{job.world_size - len(job.ranks)} rank(s) recorded elsewhere: give every node the "
            "same --root on a shared filesystem to see the whole job"
        )
    return notes


def _no_own_failure(options: LocalizeOptions, culprit: RankEvidence) -> Failure:
    """No rank failed on its own: the first error seen was a collective's or a stop."""
    outcome: dict[str, Any] = culprit.run.result.outcome or {}
    error = outcome.get("error") or {"type": "Crash", "message": culprit.error}
    return finish(
        options,
        Failure(
            status="not-localized",
            error=error_info(error, culprit.run.result.stderr),
            signature=Signature(error["type"], None, None, normalize_message(error["message"])),
            step=culprit.step,
            phase=outcome.get("phase"),
            localization="none",
            notes=(
                f"no rank failed on its own: the first error was rank {culprit.rank}'s "
                f"({culprit.kind}); a peer may have been killed or lost outside torchrun",
            ),
        ),
    )


def _timeout(job: JobResult, ranks: list[RankEvidence], options: LocalizeOptions) -> Exception:
    steps = ", ".join(
        f"rank {e.rank} at step {e.step}" for e in sorted(ranks, key=lambda e: e.rank)
    )
    return ScriptTimeoutError(
        f"the job ran past --timeout {options.timeout:g}s ({steps}); reprocut ended every rank",
        hint="raise --timeout if it is just slow; a job hangs when one rank waits in a collective "
        "that another rank never reaches",
    )
