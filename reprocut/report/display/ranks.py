"""What a torchrun job adds to the failure report: the culprit rank, one line per other rank
saying what it saw and why it does not matter (or does), and the reruns of the job that
localized the culprit's failure."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from reprocut.model.job import JobRerun, RankSummary
from reprocut.model.recording import Failure

KIND_TEXT = {
    "collective": "failed in a collective",
    "terminated": "stopped",
    "timeout": "still running at --timeout",
}


def rank_head(failure: Failure) -> Text:
    """The `rank` line of the panel's head."""
    line = Text("rank     ", style="bold")
    line.append(f"{failure.rank}", style="bold cyan")
    line.append(f" of {failure.world_size}" if failure.world_size else "")
    culprit = next((r for r in failure.ranks if r.role == "culprit"), None)
    if culprit is not None and culprit.kind in ("fault", "crash", "error", "exited"):
        line.append("   (the first rank to fail on its own)", style="dim")
    else:
        line.append("   (the first rank to fail; none failed on its own)", style="dim")
    line.append("\n")
    return line


def rank_line(summary: RankSummary, culprit: int | None) -> str:
    """One other rank, for people: what it saw, and whether it was a consequence."""
    step = f" at step {summary.step}" if summary.step is not None else ""
    later = (
        f", {summary.seconds:.2f} s later"
        if summary.seconds is not None and summary.seconds >= 0
        else ""
    )
    if summary.role == "passed":
        return f"rank {summary.rank}: finished without error{step}"
    if summary.kind == "missing":
        return f"rank {summary.rank}: {summary.error}"
    if summary.role == "consequence":
        what = KIND_TEXT.get(summary.kind, summary.kind)
        return (
            f"rank {summary.rank}: {what}{step}{later} ({summary.error}): "
            f"a consequence of rank {culprit}"
        )
    if summary.role == "same-failure":
        return (
            f"rank {summary.rank}: the same failure{step}{later} ({summary.error}): "
            "the same bug hit this rank too"
        )
    if summary.role == "own-failure":
        return f"rank {summary.rank}: failed on its own too{step}{later} ({summary.error})"
    return f"rank {summary.rank}: {summary.kind}{step}{later} ({summary.error})"


def rerun_line(rerun: JobRerun) -> str:
    """One rerun of the job, for people: how it ran, why, and how the localized rank ended."""
    if rerun.first_step is None:
        how = f"rank {rerun.rank} localizing ({rerun.attempt})"
    elif rerun.first_step == rerun.last_step:
        how = f"rank {rerun.rank} synchronized at step {rerun.first_step}"
    else:
        how = f"rank {rerun.rank} synchronized at steps {rerun.first_step}-{rerun.last_step}"
    end = next((e for e in rerun.ranks if e.rank == rerun.rank), None)
    if end is None:
        ended = f"rank {rerun.rank} did not start"
    elif end.reported:
        ended = f"rank {rerun.rank} reported its failure"
    else:
        ended = f"rank {rerun.rank} died without reporting"
    because = f" ({rerun.because})" if rerun.because else ""
    return f"the job ran again{because}: {how}, the other ranks plainly; {ended}"


def other_ranks(failure: Failure) -> Text:
    text = Text("\nother ranks", style="bold")
    for summary in failure.ranks:
        if summary.role == "culprit":
            continue
        text.append("\n  ")
        text.append(rank_line(summary, failure.rank), style="dim" if summary.role else "")
    if failure.job_reruns:
        text.append("\nreruns of the job", style="bold")
        for rerun in failure.job_reruns:
            text.append("\n  ")
            text.append(rerun_line(rerun))
    return text


def ranks_json(failure: Failure) -> dict[str, Any]:
    """`rank`, `world_size` and `ranks` for --json (present only for a torchrun job)."""
    return {
        "rank": failure.rank,
        "world_size": failure.world_size,
        "ranks": [
            {
                "rank": r.rank,
                "status": r.role,
                "kind": r.kind,
                "last_step": r.step,
                "error": r.error,
                "seconds_after_culprit": r.seconds,
                "stderr_tail": r.stderr_tail,
            }
            for r in failure.ranks
        ],
        "job_reruns": [rerun.to_json() for rerun in failure.job_reruns],
    }
