"""Never end with a repro that does not reproduce when one that did was in hand.

Every candidate the shrinker (or the source reducer) accepts is written, in order, into the
output's `accepted/` folder as the script it would be: 0000.py is the unshrunk start, the last
file the final repro (`AcceptedLog`, fed by the shrink's own events). When the final repro.py
does not verify under plain runs, `walk_back` looks through that list for the latest, that is
smallest, candidate that does: the unshrunk one first (if it fails too, there is nothing to walk
back to), then a binary search between the last candidate known to reproduce and the first known
not to, one plain run a probe; the candidate it settles on then gets the full verification, and
one that proves flaky moves the search back again.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprocut.model.case import ReproCase
from reprocut.shrink.emitter import SIDECAR_NAME, count_statements

ACCEPTED_DIR = "accepted"
# render(case) -> (repro.py text, captured keys it loads from the sidecar)
Render = Callable[[ReproCase], tuple[str, tuple[str, ...]]]


@dataclass(frozen=True, slots=True)
class Entry:
    """One accepted candidate on disk."""

    index: int
    path: Path
    tensor_elements: int | None


class AcceptedLog:
    """The accepted candidates of one shrink, in order, as runnable scripts."""

    def __init__(
        self,
        folder: Path,
        *,
        render: Render | None = None,
        inputs: Mapping[str, Any] | None = None,
        finish: Callable[[str], str] | None = None,
    ) -> None:
        """`render`: a case-level shrink's case -> script; `inputs`: the captured tensors its
        sidecar holds; `finish`: what a source-level reduction does to its final script (pin the
        script's folder, end with a synchronize), done to each accepted one alike."""
        self.folder = folder
        self.render = render
        self.inputs = inputs or {}
        self.finish = finish or (lambda code: code)
        self.entries: list[Entry] = []
        self._keys: set[str] = set()
        if folder.exists():
            shutil.rmtree(folder)  # a new shrink: the last one's candidates are not ours
        folder.mkdir(parents=True)

    def add_code(self, code: str, tensor_elements: int | None = None) -> None:
        path = self.folder / f"{len(self.entries):04d}.py"
        path.write_text(code)
        self.entries.append(Entry(len(self.entries), path, tensor_elements))

    def add_case(self, case: ReproCase) -> None:
        assert self.render is not None
        code, keys = self.render(case)
        if not set(keys) <= self._keys:  # one sidecar for all: the union of what they load
            import torch

            self._keys |= set(keys)
            torch.save({k: self.inputs[k] for k in sorted(self._keys)}, self.folder / SIDECAR_NAME)
        self.add_code(code, case.total_numel())

    def watch(self, on_event: Callable[[Any], None]) -> Callable[[Any], None]:
        """`on_event` that also logs: the case shrinker's first event carries its start, each
        "accepted" one the new best; the source reducer's SourceAccepted carries the script."""

        def logged(event: Any) -> None:
            best = getattr(event, "best", None)
            if isinstance(best, ReproCase) and self.render is not None:
                if not self.entries or getattr(event, "kind", "") == "accepted":
                    self.add_case(best)
            elif self.entries and hasattr(event, "lines") and isinstance(event.code, str):
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

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": None if self.chosen is None else self.chosen.index,
            "candidates": self.candidates,
            "probes": self.probes,
            "reason": self.reason,
        }


def walk_back(
    log: AcceptedLog,
    *,
    reproduces: Callable[[Path], bool],
    verifies: Callable[[Path], bool],
    final_failed: bool = True,
) -> WalkBack:
    """The latest accepted candidate that verifies (see the module docstring). `reproduces`:
    one plain run fails with the signature; `verifies`: the full verification passes (the
    caller runs them: check/verify.py). `final_failed`: the last entry is known not to verify."""
    entries = log.entries
    probes = 0

    def probe(entry: Entry) -> bool:
        nonlocal probes
        probes += 1
        return reproduces(entry.path)

    if len(entries) < 2:
        return WalkBack(None, probes, len(entries), "no earlier candidate was accepted")
    bad = len(entries) - 1 if final_failed else len(entries)
    while bad > 0:
        if not probe(entries[0]):
            return WalkBack(None, probes, len(entries), "the unshrunk candidate does not verify")
        good = 0
        while bad - good > 1:
            middle = (good + bad) // 2
            if probe(entries[middle]):
                good = middle
            else:
                bad = middle
        if verifies(entries[good].path):
            return WalkBack(entries[good], probes, len(entries), "verified")
        bad = good  # flaky: look further back
    return WalkBack(None, probes, len(entries), "no accepted candidate verifies")


def install(chosen: Entry, out: Path) -> str:
    """Write the chosen candidate as out/repro.py (with the sidecar it may load)."""
    code = chosen.path.read_text()
    sidecar = chosen.path.with_name(SIDECAR_NAME)
    if sidecar.exists() and SIDECAR_NAME in code:
        shutil.copyfile(sidecar, out / SIDECAR_NAME)
    (out / "repro.py").write_text(code)
    return code


def statements_of(code: str) -> int:
    """Statements of a chosen candidate, counted as the shrink counts its result."""
    return count_statements(code) or sum(1 for line in code.splitlines() if line.strip())
