"""What a source reduction hands out: events as it goes, a SourceResult at the end.

The loop emits the events (a candidate checked, a smaller script accepted: the caller saves
it and shows progress) and the entry point builds the result; callers read both without the
machinery that made them, so they live on their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceAccepted:
    """A smaller script that still fails the same way (the caller may save it)."""

    pass_name: str
    code: str
    lines: int
    checks: int


@dataclass(frozen=True, slots=True)
class SourceChecked:
    """One candidate was run (`lines`: the best script's, after its verdict)."""

    pass_name: str
    checks: int
    accepted: bool
    lines: int = 0


@dataclass(frozen=True, slots=True)
class SourceRound:
    """A round of passes changed the best: another round follows (the later rounds take little,
    their best is the repro's, or nearly)."""

    pass_name: str  # the round's last pass
    checks: int
    lines: int


SourceEvent = SourceAccepted | SourceChecked | SourceRound


@dataclass(frozen=True, slots=True)
class SourceResult:
    code: str
    statements: int
    lines: int
    checks: int
    seconds: float
    accepted: tuple[tuple[str, int], ...]  # (pass name, accepted candidates), passes in order
    stopped: str  # "fixed point", or the limit that ended it (reprocut.model.limits)
    original_lines: int = 0
    parallel: int = 1  # candidates checked at once
    discarded: int = 0  # speculative checks whose verdicts were not needed (not in `checks`)
    # candidates not run: their code up to where a checked one raised was that one's
    known_failures: int = 0
    preloaded: tuple[str, ...] = ()  # packages the fork server imported for every check
