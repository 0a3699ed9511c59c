"""A torchrun job's recording: one single-process recording per rank, inside the job's run folder.

`reprocut record -- torchrun ...` adds to `.reprocut/runs/<id>/`:
    rank.config.json   what every rank's bootstrap reads (script, argv, recorder options)
    torchrun.stdout.txt, torchrun.stderr.txt   the launcher's own output (ranks interleaved)
    ranks/<rank>/      one recording per global rank, as `record` of one process writes it
                       (record.*, trace.jsonl, inputs.pt, failure.json for the culprit), plus
                       rank.json: how that rank's process ran and ended
    rank.localize.config.json, torchrun.localize.*, ranks/<rank>/localize.*, rank.localize.json
                       a rerun of the whole job to localize the culprit rank's failure (its
                       attempt names the files, as a single-process rerun's do)
    nodes/<node>.json  one per `reprocut record` process of the job: a multi-node job shares
                       one folder when --root is on a filesystem every node sees
meta.json names the culprit rank, and `reprocut shrink` of the job folder shrinks that rank's
recording. A leaf module: nothing from reprocut is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RANKS_DIR = "ranks"
RANK_FILE = "rank.json"
NODES_DIR = "nodes"
JOB_CONFIG = "rank.config.json"
RESTARTS_DIR = "restarts"  # ranks of torchrun's restarted attempts, never analysed


def rank_file(attempt: str = "record") -> str:
    """The file a rank's bootstrap keeps current during one attempt of the job."""
    return RANK_FILE if attempt == "record" else f"rank.{attempt}.json"


def job_config(attempt: str = "record") -> str:
    return JOB_CONFIG if attempt == "record" else f"rank.{attempt}.config.json"


def tail_of(text: str, lines: int = 40, chars: int = 4000) -> str:
    """The end of a rank's stderr, enough to tell how it died (faulthandler's stacks, a fatal
    error, a kernel assertion) without holding the whole log."""
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return tail[-chars:]


def rank_path(job: Path, rank: int, restart: int = 0) -> Path:
    """Where global rank `rank` records (attempts after a torchrun restart go elsewhere)."""
    if restart:
        return job / RESTARTS_DIR / str(restart) / str(rank)
    return job / RANKS_DIR / str(rank)


def rank_folders(job: Path) -> dict[int, Path]:
    """The first attempt's rank folders by global rank."""
    ranks = job / RANKS_DIR
    if not ranks.is_dir():
        return {}
    return {int(p.name): p for p in ranks.iterdir() if p.is_dir() and p.name.isdigit()}


def is_job(path: Path) -> bool:
    return (path / RANKS_DIR).is_dir()


def culprit_path(run: Path) -> Path:
    """The recording `shrink` works on: a job's culprit rank, or the run itself."""
    if not is_job(run):
        return run
    try:
        rank = json.loads((run / "meta.json").read_text()).get("culprit_rank")
    except (OSError, json.JSONDecodeError):
        return run
    return rank_path(run, rank) if isinstance(rank, int) else run


@dataclass(frozen=True, slots=True)
class RankSummary:
    """One rank of a job as the report shows it.

    kind: what ended it: "fault" (a torch op or CUDA error), "crash" (died by a signal of its
    own), "error" (a plain Python error), "exited" (sys.exit(n)), "collective" (a collective
    failed: a peer was gone), "terminated" (stopped by torchrun or reprocut), "timeout",
    "passed", "missing" (no record: another node, or it never started).
    role: "culprit", "same-failure" (the same fault, later), "own-failure" (another fault of
    its own), "consequence", "passed", "unknown".
    """

    rank: int
    kind: str
    role: str
    step: int | None = None  # completed optimizer steps when it ended
    error: str = ""  # one line, e.g. "IndexError: index out of range in self"
    seconds: float | None = None  # when it failed, relative to the culprit's failure
    stderr_tail: str = ""  # the end of its stderr (tail_of)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "kind": self.kind,
            "role": self.role,
            "step": self.step,
            "error": self.error,
            "seconds": self.seconds,
            "stderr_tail": self.stderr_tail,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankSummary:
        return cls(
            rank=data["rank"],
            kind=data["kind"],
            role=data["role"],
            step=data.get("step"),
            error=data.get("error", ""),
            seconds=data.get("seconds"),
            stderr_tail=data.get("stderr_tail", ""),
        )


@dataclass(frozen=True, slots=True)
class RankEnd:
    """How one rank's process ended in a rerun of the job."""

    rank: int
    returncode: int | None
    signal: int | None
    reported: bool  # it wrote its outcome (only the localized rank runs under the recorder)
    stderr_tail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "returncode": self.returncode,
            "signal": self.signal,
            "reported": self.reported,
            "stderr_tail": self.stderr_tail,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankEnd:
        return cls(
            data["rank"],
            data.get("returncode"),
            data.get("signal"),
            bool(data.get("reported")),
            data.get("stderr_tail", ""),
        )


@dataclass(frozen=True, slots=True)
class JobRerun:
    """One rerun of the whole job (the real torchrun, the same arguments) with one rank
    localizing: synchronized around every op of steps first_step..last_step (or blocking
    launches: see `attempt`), the other ranks run plainly."""

    rank: int
    attempt: str  # "localize", "localize-blocking", ...: names the files it left
    first_step: int | None
    last_step: int | None
    because: str  # why the job ran again: "rank 1 died before reporting (SIGSEGV)"
    returncode: int | None  # torchrun's
    seconds: float
    ranks: tuple[RankEnd, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "attempt": self.attempt,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "because": self.because,
            "returncode": self.returncode,
            "seconds": self.seconds,
            "ranks": [end.to_json() for end in self.ranks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRerun:
        return cls(
            rank=data["rank"],
            attempt=data["attempt"],
            first_step=data.get("first_step"),
            last_step=data.get("last_step"),
            because=data.get("because", ""),
            returncode=data.get("returncode"),
            seconds=data.get("seconds", 0.0),
            ranks=tuple(RankEnd.from_json(r) for r in data.get("ranks", ())),
        )
