"""The ways `reprocut shrink` makes a repro from a recorded failure, tried in order.

Each way has one shape: does it apply to this failure, try it within its limits, and either an
Outcome to verify or the reason it declined (what its candidate did instead). The first Outcome
wins; the reasons of the ways before it are said on the terminal, in `--json` (`declined`) and in
report.md, so "the captured call of `ns::op` did not reproduce: it raised NameError: ..." comes
before the script reduction that follows, and a new way is one more class here, not a branch.

- `CapturedCall`: the captured call (an aten op's, or a custom op's with the code that
  registers it), shrunk by the case passes (pipeline/cases.py).
- `ScriptReduction`: the user's script, reduced by the source passes (pipeline/scripts.py): for
  faults outside the dispatcher, `--source`, and a captured call that did not reproduce.

(The out-of-memory request's torch.empty repro and the compile-only reduction are made and
verified by paths of their own: pipeline/request_repro.py and pipeline/compiled.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from reprocut.check.agreement import PlainAgreement
from reprocut.check.oracle import Oracle
from reprocut.model.recording import Failure, RunDir
from reprocut.pipeline.cases import Outcome, shrink_case, with_definitions
from reprocut.pipeline.declined import Declined
from reprocut.pipeline.first_check import FirstCheck
from reprocut.pipeline.phases import SOURCE, Phases
from reprocut.pipeline.recover import unshrunk_script
from reprocut.pipeline.scripts import shrink_source
from reprocut.pipeline.settings import ShrinkSettings
from reprocut.report.display.console import print_line
from reprocut.report.display.shrink import print_phase
from reprocut.shrink.header import Environment
from reprocut.shrink.walkback import AcceptedLog


@dataclass(frozen=True, slots=True)
class Shrinking:
    """What every way may use: the failure, its inputs, the oracle and the shrink's limits.
    `source`: the script is what is reduced (--source, a fault outside the dispatcher, no
    captured call); `defined`: the failure with its cases' custom-op definitions, read once."""

    run_dir: RunDir
    failure: Failure
    inputs: dict[str, Any]
    environment: Environment
    oracle: Oracle
    settings: ShrinkSettings
    phases: Phases
    on_event: Callable[[Any], None]
    console: Console
    out: Path
    source: bool
    log: AcceptedLog | None = None
    agreement: PlainAgreement | None = None
    first: FirstCheck | None = None
    defined: Failure | None = None

    def limits(self) -> dict[str, Any]:
        return {
            "max_checks": self.settings.max_checks,
            "max_time": self.settings.max_time,  # None: to the fixed point, under the cap
        }


@dataclass(frozen=True, slots=True)
class Unmade:
    """A way that declined, and what it leaves for the record if no later way makes one."""

    declined: Declined
    outcome: Outcome


class Way(Protocol):
    name: str

    def applies(self, shrinking: Shrinking) -> bool: ...

    def attempt(self, shrinking: Shrinking, before: Sequence[Declined]) -> Outcome | Unmade: ...


class CapturedCall:
    """The recorded call (with its custom op's definitions), shrunk by the case passes."""

    name = "captured call"

    def applies(self, shrinking: Shrinking) -> bool:
        return not shrinking.source

    def attempt(self, shrinking: Shrinking, before: Sequence[Declined]) -> Outcome | Unmade:
        outcome = shrink_case(
            shrinking.defined or with_definitions(shrinking.failure),
            shrinking.inputs,
            shrinking.oracle,
            out=shrinking.out,
            environment=shrinking.environment,
            on_event=shrinking.on_event,
            phases=shrinking.phases,
            agreement=shrinking.agreement,
            first=shrinking.first,
            **shrinking.limits(),
        )
        if outcome.reproduced_from_capture:
            return outcome
        reason = outcome.declined or "the captured call did not reproduce"
        return Unmade(Declined(self.name, reason), outcome)


class ScriptReduction:
    """The user's script, reduced while it fails the same way."""

    name = "script"

    def applies(self, shrinking: Shrinking) -> bool:
        script = shrinking.failure.script
        return shrinking.source or (bool(script) and Path(script).is_file())

    def attempt(self, shrinking: Shrinking, before: Sequence[Declined]) -> Outcome | Unmade:
        failure, console = shrinking.failure, shrinking.console
        if before:  # a captured call came first: its candidates get a script's plain runs now
            print_phase(console, "reducing the script instead")
            if shrinking.agreement is not None:
                shrinking.agreement.start_scripts()
            if shrinking.log is not None and not shrinking.log.entries:
                shrinking.log.start_source(unshrunk_script(failure))
        elif (
            not failure.cases
            and not shrinking.settings.source
            and failure.status != "outside-dispatcher"
        ):
            print_phase(console, "no captured call to shrink: reducing the script instead")
        with shrinking.phases.phase(SOURCE):
            return shrink_source(
                failure,
                shrinking.oracle,
                on_event=shrinking.on_event,
                kept=shrinking.run_dir.launch_probe_path,
                traceback=shrinking.run_dir.recorded_traceback(),
                **shrinking.limits(),
            )


WAYS: tuple[Way, ...] = (CapturedCall(), ScriptReduction())


def make_repro(
    shrinking: Shrinking, ways: Sequence[Way] = WAYS
) -> tuple[Outcome, tuple[Declined, ...]]:
    """The first way's Outcome that reproduces, and the ways that declined before it; when
    none does, the last declined way's outcome (the recorded call, for the record)."""
    declined: list[Declined] = []
    unmade: Unmade | None = None
    for way in ways:
        if not way.applies(shrinking):
            continue
        result = way.attempt(shrinking, tuple(declined))
        if isinstance(result, Outcome):
            return result, tuple(declined)
        declined.append(result.declined)
        print_line(shrinking.console, f"[yellow]note[/]: {result.declined.reason}")
        unmade = result
    if unmade is None:
        raise ValueError("no way to make a repro applies to this failure")
    return unmade.outcome, tuple(declined)
