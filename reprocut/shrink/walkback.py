"""Never end with a repro that does not reproduce when one that did was in hand.

Every candidate the shrinker (or the source reducer) accepts is written, in order, into the
output's `accepted/` folder as the script it would be: 0000.py is the unshrunk start, the last
file the final repro (`AcceptedLog`, fed by the shrink's own events). When the final repro.py
does not verify under plain runs, `walk_back` looks through that list for the latest, that is
smallest, candidate that does: the unshrunk one first (if it fails too, there is nothing to walk
back to), then a search between the last candidate known to reproduce and the first known not to, one
plain run a probe (a bisection, or on a machine with cores to spare several probes side by
side); the candidate it settles on then gets the full verification, and one that proves flaky
moves the search back again.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprocut.model.case import ReproCase
from reprocut.shrink.emitter import SIDECAR_NAME, emit, inline_captured
from reprocut.shrink.header import Header
from reprocut.source.speculation import span_cuts

ACCEPTED_DIR = "accepted"
# render(case, inputs) -> (repro.py text, captured keys it loads from the sidecar)
Render = Callable[[ReproCase, Mapping[str, Any]], tuple[str, tuple[str, ...]]]


@dataclass(frozen=True, slots=True)
class Entry:
    """One accepted candidate: a script on disk, or a case (its script is rendered when the
    walk-back first needs it: most shrinks verify and never do)."""

    index: int
    path: Path  # NNNN.py (for a case: where its script goes)
    case: ReproCase | None = None


class AcceptedLog:
    """The accepted candidates of one shrink, in order."""

    def __init__(self, folder: Path, *, finish: Callable[[str], str] | None = None) -> None:
        """`finish`: what a source-level reduction does to its final script (pin the script's
        folder, end with a synchronize), done to each accepted one alike."""
        self.folder = folder
        self.finish = finish or (lambda code: code)
        self.entries: list[Entry] = []
        self._keys: set[str] = set()
        # called once with the first entry (the unshrunk case or script), on the adding thread
        self.on_first: Callable[[Entry], None] | None = None
        if folder.exists():
            shutil.rmtree(folder)  # a new shrink: the last one's candidates are not ours
        folder.mkdir(parents=True)

    def _next(self) -> Path:
        return self.folder / f"{len(self.entries):04d}.py"

    def add_code(self, code: str) -> None:
        path = self._next()
        path.write_text(code)
        self._add(Entry(len(self.entries), path))

    def add_case(self, case: ReproCase) -> None:
        path = self._next()
        path.with_suffix(".json").write_text(case.dumps())
        self._add(Entry(len(self.entries), path, case))

    def _add(self, entry: Entry) -> None:
        self.entries.append(entry)
        if len(self.entries) == 1 and self.on_first is not None:
            self.on_first(entry)

    def script(self, entry: Entry, render: Render | None, inputs: Mapping[str, Any]) -> Path:
        """The entry's script on disk (a case's rendered now; one sidecar serves them all)."""
        if entry.case is None or entry.path.exists():
            return entry.path
        if render is None:
            raise ValueError("a case candidate needs a render function")
        code, keys = render(entry.case, inputs)
        if not set(keys) <= self._keys:  # the union of what they load
            import torch

            self._keys |= set(keys)
            torch.save({k: inputs[k] for k in sorted(self._keys)}, self.folder / SIDECAR_NAME)
        entry.path.write_text(code)
        return entry.path

    def watch(self, on_event: Callable[[Any], None]) -> Callable[[Any], None]:
        """`on_event` that also logs: the case shrinker's first event carries its start, each
        "accepted" one the new best; the source reducer's SourceAccepted carries the script."""

        def logged(event: Any) -> None:
            best = getattr(event, "best", None)
            if isinstance(best, ReproCase):
                first = not self.entries
                if first or (event.kind == "accepted" and self.entries[-1].case != best):
                    self.add_case(best)
            elif self.entries and isinstance(getattr(event, "code", None), str):
                self.add_code(self.finish(event.code))  # a SourceAccepted
            on_event(event)

        return logged

    def start_source(self, code: str) -> None:
        """The unshrunk script of a source-level reduction (its events carry only changes)."""
        if not self.entries:
            self.add_code(self.finish(code))


@dataclass(frozen=True, slots=True)
class WalkBack:
    """The outcome: the candidate written instead of the final one, or why there is none."""

    chosen: Entry | None
    probes: int
    candidates: int
    reason: str
    # the final repro that did not verify, kept beside the chosen one, and what its plain
    # runs did instead (pipeline/recover.py): why a walk-back was needed
    refused: dict[str, Any] | None = None

    def describe(self) -> str:
        """One sentence for report.md."""
        if self.chosen is None:
            return f"The shrunk repro did not verify; walking back found none that does ({self.reason})."
        later = self.candidates - 1 - self.chosen.index
        return (
            f"The smallest candidate did not reproduce in plain runs: this is accepted candidate "
            f"{self.chosen.index} of {self.candidates - 1}, the latest that does ({later} later "
            "one(s) reproduced only inside reprocut's checks)."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": None if self.chosen is None else self.chosen.index,
            "candidates": self.candidates,
            "probes": self.probes,
            "reason": self.reason,
            **({"refused": self.refused} if self.refused else {}),
        }


def walk_back(
    log: AcceptedLog,
    *,
    reproduces: Callable[[Path], bool],
    verifies: Callable[[Path], bool],
    render: Render | None = None,
    inputs: Mapping[str, Any] | None = None,
    final_failed: bool = True,
    ways: int = 2,
) -> WalkBack:
    """The latest accepted candidate that verifies (see the module docstring). `reproduces`:
    one plain run fails with the signature; `verifies`: the full verification passes (the
    caller runs them: check/verify.py). `render`, `inputs`: for case candidates, their script
    and captured tensors. `final_failed`: the last entry is known not to verify. `ways`: the
    search cuts the span between the last candidate known to reproduce and the first known not
    to that many ways, probing the cuts side by side (2: a bisection, one probe at a time);
    no candidate is probed twice."""
    entries = log.entries
    seen: dict[int, bool] = {}

    def probe_all(indices: list[int]) -> None:
        wanted = [i for i in indices if i not in seen]  # none after a flaky choice's re-walk
        if len(wanted) <= 1 or ways <= 2:
            for i in wanted:
                seen[i] = reproduces(log.script(entries[i], render, inputs or {}))
            return
        scripts = [log.script(entries[i], render, inputs or {}) for i in wanted]
        with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
            seen.update(zip(wanted, pool.map(reproduces, scripts), strict=True))

    if len(entries) < 2:
        return WalkBack(None, 0, len(entries), "no earlier candidate was accepted")
    bad = len(entries) - 1 if final_failed else len(entries)
    while bad > 0:
        probe_all([0])
        if not seen[0]:
            return WalkBack(None, len(seen), len(entries), "the unshrunk candidate does not verify")
        good = 0
        while bad - good > 1:
            cuts = span_cuts(good, bad, ways)
            probe_all(cuts)
            good = max([good, *(i for i in cuts if seen[i])])
            bad = min([bad, *(i for i in cuts if i > good and not seen[i])])
        if verifies(log.script(entries[good], render, inputs or {})):
            return WalkBack(entries[good], len(seen), len(entries), "verified")
        bad = good  # flaky: look further back
    return WalkBack(None, len(seen), len(entries), "no accepted candidate verifies")


def renderer(header: Header) -> Render:
    """A case candidate's repro.py text (small captured values inlined) and its sidecar keys."""

    def render(case: ReproCase, inputs: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
        emitted = emit(inline_captured(case, inputs), header)
        return emitted.code, emitted.sidecar_keys

    return render


def install(chosen: Entry, out: Path) -> str:
    """Write the chosen candidate (its script rendered by now) as out/repro.py, with the
    sidecar it may load."""
    code = chosen.path.read_text()
    sidecar = chosen.path.with_name(SIDECAR_NAME)
    if sidecar.exists() and SIDECAR_NAME in code:
        shutil.copyfile(sidecar, out / SIDECAR_NAME)
    (out / "repro.py").write_text(code)
    return code
