"""An out-of-memory whose request alone exceeds the device ▶ repro.py at once, no reduction.

Such a failure depends on the sizes only: the failing op called on `torch.empty` inputs of the
recorded shapes, strides and dtypes asks for the same bytes and fails with the same error on
any device that size. So the shrink skips the fork server and the passes: it writes that
script and verifies it with the same plain `python repro.py` runs as any repro
(reprocut.check.verify). A backward-phase op is called directly (the op autograd ran, by its
public name), with the forward line that built it named in the header. Only when that script
does not verify does the shrink fall back to reducing the captured call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from reprocut.check.verify import Verification, verify
from reprocut.model.case import ReproCase
from reprocut.model.errors import ExitCode
from reprocut.model.memory import CAUSE_REQUEST
from reprocut.model.oom import OOM_KIND
from reprocut.model.recording import Failure, atomic_write
from reprocut.pipeline.cases import Outcome, failure_header
from reprocut.pipeline.phases import READ, VERIFY, Phases
from reprocut.report.display.shrink import print_phase
from reprocut.report.markdown import collect_environment
from reprocut.shrink.emitter import emit
from reprocut.shrink.empty_inputs import empty_case
from reprocut.shrink.header import Environment

# how the repro was made (`path` in --json, a line in report.md)
PATH_EMPTY_INPUTS = "empty-inputs"
PATH_SHRINK = "shrink"
PATH_SOURCE = "source"


@dataclass(frozen=True, slots=True)
class RequestRepro:
    """The value-less repro written, and what its plain runs said."""

    outcome: Outcome
    verification: Verification
    case: ReproCase
    environment: Environment

    @property
    def verified(self) -> bool:
        return self.verification.exit_code == ExitCode.OK

    def note(self) -> str:
        """The line report.md gives the path taken."""
        return (
            "Made without a reduction: the request alone exceeds what the device had, so the "
            f"failing op (`{self.case.target}`) is called on `torch.empty` inputs of the "
            "recorded shapes, strides and dtypes (no captured values)."
        )

    def fallback_note(self) -> str:
        return (
            f"the torch.empty repro of {self.case.target} did not verify "
            f"({self.verification.describe()}): reducing the captured call instead"
        )


def applies(failure: Failure) -> bool:
    """An out-of-memory whose request alone is too big (record's memory report says so)."""
    memory = failure.memory
    return (
        failure.signature.kind == OOM_KIND
        and memory is not None
        and memory.cause == CAUSE_REQUEST
        and bool(failure.cases)
    )


def _value_less_case(failure: Failure) -> ReproCase | None:
    """The first recorded case (most public first) that can be called on empty inputs."""
    backward = failure.phase == "backward"
    for case in failure.cases:
        empty = empty_case(case, backward=backward)
        if empty is not None:
            return empty
    return None


def header_notes(failure: Failure) -> tuple[str, ...]:
    """Why the request is that big, and for a backward op the forward line that built it."""
    notes = []
    if failure.memory is not None and failure.memory.why:
        notes.append(f"Why: {failure.memory.why[0]}")
    forward = failure.forward_source
    phase = failure.memory.phase if failure.memory is not None else None
    source = failure.source
    if phase and phase.startswith("recompute") and source is not None:  # a checkpoint's
        notes.append(
            f"Phase: {phase}; the line: `{source.text.split('#')[0].strip()}` "
            f"({Path(source.file).name}:{source.line})"
        )
    elif failure.phase == "backward" and forward is not None:
        notes.append(
            f"Phase: backward; autograd ran {failure.op or 'this op'} for "
            f"`{forward.text.split('#')[0].strip()}` ({Path(forward.file).name}:{forward.line})"
        )
    return tuple(notes)


def request_repro(
    failure: Failure,
    out: Path,
    *,
    runs: int,
    timeout: float,
    phases: Phases,
    console: Console,
) -> RequestRepro | None:
    """Write repro.py as the failing op on empty inputs and verify it; None when the op has
    no value-less form (the caller shrinks the captured call). The environment is gathered
    only once there is such a form; the caller reuses it when it shrinks after all."""
    case = _value_less_case(failure)
    if case is None:
        return None
    with phases.phase(READ):
        environment = collect_environment(failure)
    on_cpu = all(spec.device == "cpu" for _, spec in case.tensors())
    header = failure_header(
        failure,
        environment,
        cpu_reproduces=True if on_cpu else None,  # a CUDA request: the CPU's allocator differs
        notes=header_notes(failure),
    )
    emitted = emit(case, header)
    repro = out / "repro.py"
    atomic_write(repro, emitted.code)
    print_phase(
        console,
        f"out of memory from the request alone: repro.py calls {case.target} on torch.empty "
        f"inputs; verifying: {runs} plain runs",
    )
    with phases.phase(VERIFY):
        verification = verify(repro, failure.signature, runs=runs, timeout=timeout)
    outcome = Outcome(
        code=emitted.code,
        statements=emitted.statements,
        tensor_elements=sum(spec.storage_numel for _, spec in case.tensors()),  # allocated
        checks=0,
        sidecar=False,
        cpu_reproduces=header.cpu_reproduces,
    )
    return RequestRepro(outcome, verification, case, environment)
