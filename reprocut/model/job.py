"""A torchrun job's recording: one single-process recording per rank, inside the job's run folder.

`reprocut record -- torchrun ...` adds to `.reprocut/runs/<id>/`:
    rank.config.json   what every rank's bootstrap reads (script, argv, recorder options)
    torchrun.stdout.txt, torchrun.stderr.txt   the launcher's own output (ranks interleaved)
    ranks/<rank>/      one recording per global rank, as `record` of one process writes it
                       (record.*, trace.jsonl, inputs.pt, failure.json for the culprit), plus
                       rank.json: how that rank's process ran and ended
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

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "kind": self.kind,
            "role": self.role,
            "step": self.step,
            "error": self.error,
            "seconds": self.seconds,
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
        )
