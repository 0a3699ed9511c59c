"""A recorded call ▶ the smallest call that still fails the same way, as repro.py text.

Picks the first recorded case (most public first) that reproduces from its captured inputs,
shrinks it with the named passes against the oracle (every accepted case saved to disk, so an
interrupted shrink keeps its best), and asks whether the same call fails on the CPU too (of each
accepted case, beside the shrink: cpu_check.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reprocut.check.agreement import PlainAgreement, reproducing_form
from reprocut.check.oracle import Oracle, Reproduced, Verdict
from reprocut.check.precision import float64_behaviour
from reprocut.model.case import ReproCase, Signature
from reprocut.model.errors import ExitCode, ReprocutError
from reprocut.model.recording import Failure, atomic_write
from reprocut.model.signature import is_memory_error
from reprocut.pipeline.case_checks import side_by_side
from reprocut.pipeline.cpu_check import CpuBeside, all_on_cpu, cpu_behaviour
from reprocut.pipeline.declined import captured_call_declined
from reprocut.pipeline.first_check import FirstCheck
from reprocut.pipeline.phases import CPU_CHECK, FIRST_CHECK, SHRINK, Phases
from reprocut.shrink.emitter import SIDECAR_NAME, Emitted, emit, inline_captured
from reprocut.shrink.header import Environment, Header, original_args
from reprocut.shrink.passes import PASSES
from reprocut.shrink.shrinker import Shrinker

BEST_FILE = "shrink-best.json"


class ShrinkInterruptedError(ReprocutError):
    slug = "interrupted"
    exit_code = ExitCode.INTERRUPTED


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a shrink produced, before verification."""

    code: str
    statements: int
    tensor_elements: int | None
    checks: int
    sidecar: bool
    reproduced_from_capture: bool = True
    cpu_reproduces: bool | None = None
    cpu_message: str = ""
    passes: tuple[tuple[str, int], ...] = ()  # a script reduction's: accepted candidates by pass
    from_script: bool = False  # the user's script reduced (not a captured call shrunk)
    stopped: str = ""  # what ended the shrink: "fixed point", or the limit that stopped it
    cpu_checked_beside: bool = False  # the CPU answer came from a check beside the shrink
    declined: str = ""  # not reproduced from the capture: what the captured call did instead
    slots: int = 1  # candidates checked side by side


def _expected(case: ReproCase, failure: Failure) -> Signature:
    return case.expected or failure.signature


def with_definitions(failure: Failure) -> Failure:
    """Cases calling a custom op (torch.ops.<ns> outside aten) carry the code registering it,
    from the script or the user's module that does, however many imports away
    (reprocut.source.custom_ops; the failure's device resolves `torch.cuda.is_available()`
    guards)."""
    if not failure.script or not Path(failure.script).is_file():
        return failure
    from reprocut.source.custom_ops import definitions_for, user_files

    files = user_files(Path(failure.script).resolve())
    cases = tuple(
        replace(case, definitions=definitions_for(case.target, files, device=failure.device))
        if not case.definitions else case
        for case in failure.cases
    )  # fmt: skip
    return replace(failure, cases=cases)


def definitions_code(defined: Failure) -> str:
    """The code registering the custom ops `defined`'s cases call, each block once."""
    return "\n".join(dict.fromkeys(case.definitions for case in defined.cases if case.definitions))


def pick_case(
    failure: Failure, inputs: dict[str, Any], oracle: Oracle, first: FirstCheck | None = None
) -> tuple[ReproCase | None, list[Verdict]]:
    """The first case (most public first) that reproduces from its captured inputs (`first`:
    a check of the first case started before the inputs were read)."""
    verdicts = []
    for case in failure.cases:
        early = None if first is None else first.verdict_for(case)
        if isinstance(early, Reproduced):
            return case, [early]
        case, verdict = reproducing_form(oracle, case, inputs, _expected(case, failure))
        verdicts.append(verdict)
        if isinstance(verdict, Reproduced):
            return case, verdicts
    return None, verdicts


def write_case(case: ReproCase, inputs: dict[str, Any], out: Path, header: Header) -> Emitted:
    """repro.py text for `case`; captured tensors too big to inline go to repro_inputs.pt."""
    inlined = inline_captured(case, inputs)
    emitted = emit(inlined, header)
    if emitted.sidecar_keys:
        import torch

        torch.save({key: inputs[key] for key in emitted.sidecar_keys}, out / SIDECAR_NAME)
    return emitted


def shrink_case(
    failure: Failure,
    inputs: dict[str, Any],
    oracle: Oracle,
    *,
    max_checks: int,
    max_time: float | None,
    out: Path,
    environment: Environment,
    on_event: Callable[[Any], None],
    phases: Phases,
    agreement: PlainAgreement | None = None,
    first: FirstCheck | None = None,
    slots: int | None = None,
) -> Outcome:
    """`slots`: candidates checked side by side (default: half the cores, at most four;
    pipeline/case_checks.py). `agreement`: the oracle's plain confirmations, whose first may still be running beside
    the shrink (its answer is waited for before the shrunk case counts). `first`: the first
    case's check, started while the inputs were read. `max_time`: the user's limit (None: to
    the fixed point, under the safety cap)."""
    header = failure_header(failure, environment)
    with phases.phase(FIRST_CHECK):  # waits for the fork server, if it is still starting
        case, verdicts = pick_case(failure, inputs, oracle, first)
    if case is None:
        declined = captured_call_declined(failure.cases, verdicts)
        return _unreproduced(failure, inputs, oracle, out, header, declined)
    expected = _expected(case, failure)
    header = replace(header, original=original_args(case, failure.tensors))  # its sizes, facts

    def predicate(candidate: ReproCase) -> bool:
        return isinstance(oracle.check_case(candidate, inputs, expected=expected), Reproduced)

    # the CPU check of each accepted case runs beside the shrink (a forked check costs little)
    beside = CpuBeside(inputs, oracle) if oracle.fork and not all_on_cpu(case) else None

    def save(best: ReproCase) -> None:
        """Every accepted case goes to disk: an interrupted shrink keeps its best repro."""
        if beside is not None:
            beside.submit(best)
        atomic_write(out / BEST_FILE, best.dumps())
        atomic_write(out / "repro.py", write_case(best, inputs, out, header).code)

    runner = side_by_side(oracle, failure, inputs, expected, slots)
    shrinker = Shrinker(
        case,
        predicate,
        runner=runner,
        # a memory fault's checks take seconds: its dimensions are searched a round of slots at a time
        ways=runner.slots if runner is not None and is_memory_error(expected) else 1,
        passes=PASSES,
        inputs=inputs,
        max_checks=max_checks,
        max_time=max_time,
        on_event=on_event,
        on_accept=save,
        cpu_visible=expected.error_code is None,
    )
    if beside is not None:
        beside.submit(case)  # the shrink may accept nothing
    try:
        with phases.phase(SHRINK):
            best = shrinker.run()
            refused = None if agreement is None else agreement.settle()
    except BaseException as exc:
        if beside is not None:
            beside.close()
        if isinstance(exc, KeyboardInterrupt):
            raise ShrinkInterruptedError(
                f"interrupted: the best case so far is in {out / 'repro.py'} (not verified)"
            ) from None
        raise
    if refused is not None:  # the recorded call failed in a fork alone: nothing shrunk counts
        if beside is not None:
            beside.close()
        declined = captured_call_declined([case], [refused])
        return _unreproduced(failure, inputs, oracle, out, header, declined)
    save(best)
    # Before the verification, not beside it: its answer is part of repro.py's header, and the
    # file the plain runs verify is the final one.
    with phases.phase(CPU_CHECK):
        answered = beside.answer_for(best) if beside is not None else None
        cpu_reproduces, cpu_message = answered or cpu_behaviour(best, inputs, oracle)
        if best.check_finite:  # a NaN/inf origin: precision, or the values themselves?
            header = replace(header, float64=float64_behaviour(best, inputs, oracle))
    header = replace(header, cpu_reproduces=cpu_reproduces, cpu_message=cpu_message)
    emitted = write_case(best, inputs, out, header)
    return Outcome(
        code=emitted.code,
        statements=emitted.statements,
        tensor_elements=best.total_numel(),
        checks=oracle.checks,
        sidecar=bool(emitted.sidecar_keys),
        cpu_reproduces=cpu_reproduces,
        cpu_message=cpu_message,
        stopped=shrinker.stopped,
        cpu_checked_beside=answered is not None,
        slots=1 if runner is None else runner.slots,
    )


def _unreproduced(
    failure: Failure,
    inputs: dict[str, Any],
    oracle: Oracle,
    out: Path,
    header: Header,
    declined: str,
) -> Outcome:
    """No recorded call reproduces: the first, as it was recorded, for the record, and what
    the calls did instead (`declined`)."""
    emitted = write_case(failure.cases[0], inputs, out, header)
    return Outcome(
        code=emitted.code,
        statements=emitted.statements,
        tensor_elements=failure.cases[0].total_numel(),
        checks=oracle.checks,
        sidecar=bool(emitted.sidecar_keys),
        reproduced_from_capture=False,
        declined=declined,
    )


def failure_header(
    failure: Failure,
    environment: Environment,
    *,
    cpu_reproduces: bool | None = None,
    notes: tuple[str, ...] = (),
) -> Header:
    """repro.py's header for `failure`: the error it must end in, its message and assertion,
    the environment."""
    return Header(
        expected=failure.signature,
        message=failure.error.message,
        assertion=_assertion(failure),
        environment=environment,
        cpu_reproduces=cpu_reproduces,
        notes=notes,
    )


def _assertion(failure: Failure) -> str:
    for assertion in failure.error.assertions:
        if isinstance(assertion, dict) and assertion.get("condition"):
            return str(assertion["condition"])
    return ""
