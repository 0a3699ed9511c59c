"""All the recordings under a root: where the root is, what each run was, which one `shrink`
takes by default, and which ones a clean-up deletes.

A run folder is summarized from its `meta.json` (written first, updated last) and, when the
run failed, its `failure.json`; a folder with either missing or unreadable is listed for what
it is, never an error, since listing is how people find the broken ones.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprocut.model.errors import NoRecordingError
from reprocut.model.recording import DEFAULT_ROOT, FAILURE_FILE, META_FILE, RunDir, atomic_write

ROOT_NAME = DEFAULT_ROOT.name


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One recording, as the list shows it."""

    run: RunDir
    script: str  # as recorded: an absolute path
    started: str  # "2026-12-01T09:37:47+0000"; "" when meta.json is unreadable
    status: str  # a Failure's status, or "passed", "unfinished", "corrupt"
    op: str | None = None  # the culprit op, or the public call
    step: int | None = None
    error: str = ""  # "IndexError: index out of range in self"

    @property
    def has_failure(self) -> bool:
        """Something `shrink` can work on: a failure localized or at least seen."""
        return self.status not in ("passed", "unfinished", "corrupt")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.run.id,
            "run_dir": str(self.run.path),
            "script": self.script,
            "started": self.started,
            "status": self.status,
            "op": self.op,
            "step": self.step,
            "error": self.error,
        }


def find_root(start: Path | None = None) -> Path | None:
    """The nearest `.reprocut/` with recordings, in `start` (the working directory) or above."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ROOT_NAME / "runs").is_dir():
            return folder / ROOT_NAME
    return None


def require_root(root: Path | None) -> Path:
    """`root` as given (--root), else the nearest one found; NoRecordingError when none is."""
    if root is not None:
        if not (root / "runs").is_dir():
            raise NoRecordingError(
                f"no recordings under {root}/",
                hint="run `reprocut record your_script.py` first, or check --root",
            )
        return root
    found = find_root()
    if found is None:
        raise NoRecordingError(
            f"no {ROOT_NAME}/ folder here or in any parent folder",
            hint="run `reprocut record your_script.py` first, or pass --root or a run directory",
        )
    return found


def summarize(run: RunDir) -> RunSummary:
    meta = _read(run.path / META_FILE)
    failure = _read(run.path / FAILURE_FILE)
    script = str((meta or {}).get("script") or (failure or {}).get("script") or "")
    started = str((meta or {}).get("started") or _modified(run.path))
    if failure is None:
        if (run.path / FAILURE_FILE).exists() or meta is None:
            status = "corrupt"
        else:
            status = "passed" if meta.get("status") == "passed" else "unfinished"
        return RunSummary(run, script, started, status)
    error = failure.get("error") if isinstance(failure.get("error"), dict) else {}
    message = str(error.get("message", "")).strip().splitlines()
    return RunSummary(
        run,
        script,
        started,
        str(failure.get("status", "corrupt")),
        failure.get("op") or failure.get("public_call"),
        failure.get("step"),
        f"{error.get('type', '')}: {message[0] if message else ''}".strip(": "),
    )


def list_runs(root: Path) -> list[RunSummary]:
    """Every recording under `root`, oldest first."""
    runs = root / "runs"
    if not runs.is_dir():
        return []
    found = [summarize(RunDir(path.resolve())) for path in runs.iterdir() if path.is_dir()]
    return sorted(found, key=lambda s: (s.started, s.run.path.stat().st_mtime, s.run.id))


def latest_failed(root: Path) -> tuple[RunSummary, list[RunSummary]]:
    """The newest recording with a failure, and the newer ones passed over (passed runs,
    unfinished ones): `shrink` without a run directory takes it."""
    runs = list_runs(root)
    for index in range(len(runs) - 1, -1, -1):
        if runs[index].has_failure:
            return runs[index], runs[index + 1 :]
    raise NoRecordingError(
        f"none of the {len(runs)} recording(s) under {root}/ holds a failure",
        hint="`reprocut runs` lists them; record a failing script with `reprocut record`",
    )


def clean(root: Path, keep: int) -> tuple[list[RunSummary], list[RunSummary]]:
    """Delete all but the `keep` newest recordings; (deleted, kept)."""
    runs = list_runs(root)
    cut = max(len(runs) - max(keep, 0), 0)
    deleted, kept = runs[:cut], runs[cut:]
    for summary in deleted:
        shutil.rmtree(summary.run.path, ignore_errors=True)
    pointer = root / "latest"
    if kept:
        atomic_write(pointer, kept[-1].run.id)
    else:
        pointer.unlink(missing_ok=True)
    return deleted, kept


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _modified(path: Path) -> str:
    """The folder's time, in meta.json's format, for a run whose meta.json is gone."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(path.stat().st_mtime))
