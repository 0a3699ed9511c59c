"""Turn a recording into a minimal, verified repro.py (and report.md to paste into an issue).

Picks the first recorded case (most public first) that reproduces from its captured inputs,
shrinks it with the named passes against the fork-server oracle, writes repro.py and report.md,
then runs repro.py three times with plain `python` to verify it.
Custom kernels (and --source) go through source-level reduction of the original script instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from reprocut.check.agreement import PlainAgreement, reproducing_form
from reprocut.check.oracle import Oracle, OtherFailure, Passed, Reproduced, Verdict
from reprocut.check.sanitizer import evidence_for
from reprocut.check.verify import Verification, run_plain, verify
from reprocut.model.case import ReproCase, Signature
from reprocut.model.errors import CorruptRecordingError, ExitCode, NotReproducedError, ReprocutError
from reprocut.model.recording import Failure, RunDir, atomic_write
from reprocut.report.display.sanitizer import print_evidence
from reprocut.report.display.shrink import print_phase, print_result, shrink_display
from reprocut.report.markdown import ReportInputs, collect_environment, render
from reprocut.shrink.emitter import SIDECAR_NAME, Emitted, count_statements, emit, inline_captured
from reprocut.shrink.header import Environment, Header
from reprocut.shrink.passes import PASSES
from reprocut.shrink.shrinker import Shrinker
from reprocut.shrink.walkback import (
    ACCEPTED_DIR,
    AcceptedLog,
    WalkBack,
    install,
    renderer,
    walk_back,
)

BEST_FILE = "shrink-best.json"


class SourceReducerMissingError(ReprocutError):
    slug = "no-source-reducer"


class NothingToShrinkError(ReprocutError):
    slug = "script-error"
    exit_code = ExitCode.SCRIPT_ERROR


class ShrinkInterruptedError(ReprocutError):
    slug = "interrupted"
    exit_code = ExitCode.INTERRUPTED


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", nargs="?", type=Path, help="a recording (default: the latest)")
    parser.add_argument("--out", type=Path, help="where to write repro.py and report.md")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--max-checks", type=int, default=500, help="oracle checks (default 500)")
    parser.add_argument("--max-time", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per check (60)")
    parser.add_argument("--no-fork", action="store_true", help="a fresh python per check")
    parser.add_argument("--source", action="store_true", help="reduce the original script")
    parser.add_argument("--runs", type=int, default=3, help="plain verification runs (3)")


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


def load_inputs(run: RunDir) -> dict[str, Any]:
    if not run.inputs_path.exists():
        return {}
    import torch

    try:
        data = torch.load(run.inputs_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptRecordingError(
            f"{run.inputs_path} cannot be read: {exc}",
            hint="record the script again with `reprocut record`",
        ) from exc
    if not isinstance(data, dict):
        raise CorruptRecordingError(f"{run.inputs_path} does not hold a dict of tensors")
    return data


def run(options: argparse.Namespace, console: Console) -> ExitCode:
    started = time.monotonic()
    run_dir = RunDir.open(options.run_dir) if options.run_dir else RunDir.latest()
    failure = run_dir.read_failure()
    if failure.status == "script-error" and not options.source:
        raise NothingToShrinkError(
            f"the recorded failure is not in a torch op ({failure.error.type}: "
            f"{failure.error.message.strip().splitlines()[0] if failure.error.message.strip() else ''})",
            hint="fix the script error first; `--source` reduces the script anyway",
        )
    out = (options.out or run_dir.path).resolve()
    out.mkdir(parents=True, exist_ok=True)
    environment = collect_environment(failure)
    agreement = PlainAgreement(timeout=options.timeout * 2)  # plain runs where a fork may differ
    oracle = Oracle(
        failure.signature, fork=not options.no_fork, timeout=options.timeout, confirm=agreement
    )
    agreement.warm_up()
    show = not options.json or sys.stderr.isatty()
    log = AcceptedLog(out / ACCEPTED_DIR, finish=_source_finish(failure))
    inputs: dict[str, Any] = {}
    try:
        with shrink_display(console, enabled=show) as on_event:
            on_event = log.watch(on_event)
            if options.source or failure.status == "outside-dispatcher" or not failure.cases:
                if (
                    not failure.cases
                    and not options.source
                    and failure.status != "outside-dispatcher"
                ):
                    print_phase(console, "no captured call to shrink: reducing the script instead")
                if failure.script and Path(failure.script).is_file():
                    original = Path(failure.script).read_text()
                    log.start_source(original)
                    agreement.trust(original)  # it failed so in the user's own run
                outcome = shrink_source(failure, oracle, options, on_event)
            else:
                inputs = load_inputs(run_dir)
                outcome = shrink_case(failure, inputs, oracle, options, out, environment, on_event)
    finally:
        oracle.close()
        agreement.close()
    if oracle.fork_disabled:
        console.print(f"[yellow]note[/]: checks ran in fresh processes ({oracle.fork_disabled})")
    repro = out / "repro.py"
    atomic_write(repro, outcome.code)
    print_phase(console, f"verifying: {options.runs} runs of python {repro.name}")
    verification = verify(repro, failure.signature, runs=options.runs, timeout=options.timeout * 2)
    walked = None
    if verification.exit_code != ExitCode.OK and outcome.reproduced_from_capture:
        outcome, verification, walked = _walk_back(
            log, outcome, verification, failure, inputs, environment, options, out, console
        )
    evidence = evidence_for(repro, failure.signature, timeout=options.timeout * 3)
    if evidence is not None:  # a memory fault: memcheck names the access, thread and tensor
        print_evidence(console, evidence.to_json())
        outcome = replace(outcome, code=repro.read_text())
    seconds = time.monotonic() - started
    report = out / "report.md"
    notes = () if walked is None else (walked.describe(),)
    report_inputs = replace(
        _report_inputs(outcome, failure, environment, verification, seconds),
        notes=notes,
        sanitizer="" if evidence is None else evidence.markdown(),
    )
    atomic_write(report, render(report_inputs))
    result = _result(outcome, failure.signature, verification, repro, report, seconds)
    result["agreement"] = agreement.to_json()
    if walked is not None:
        result["walk_back"] = walked.to_json()
    if evidence is not None:
        result["sanitizer"] = evidence.to_json()
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        print(repro)
        print_result(console, {**result, "signature_text": failure.signature.describe()})
    if not outcome.reproduced_from_capture:
        console.print(
            "[yellow]the captured call did not reproduce the failure[/]: repro.py is the "
            "unshrunk candidate. hint: try `reprocut shrink --source`"
        )
        return ExitCode.NOT_REPRODUCED
    return verification.exit_code


def _status(outcome: Outcome, verification: Verification) -> str:
    if not outcome.reproduced_from_capture:
        return "not-reproduced"
    if verification.reproduced == verification.runs:
        return "verified"
    return "flaky" if verification.reproduced else "not-verified"


def _result(
    outcome: Outcome,
    signature: Signature,
    verification: Verification,
    repro: Path,
    report: Path,
    seconds: float,
) -> dict[str, Any]:
    return {
        "status": _status(outcome, verification),
        "repro": str(repro),
        "report": str(report),
        "statements": outcome.statements,
        "tensor_elements": outcome.tensor_elements,
        "checks": outcome.checks,
        "seconds": round(seconds, 3),
        "signature": {
            "error_type": signature.error_type,
            "error_code": signature.error_code,
            "op": signature.op,
            "kind": signature.kind,
        },
        "cpu_reproduces": outcome.cpu_reproduces,
        "cpu_message": outcome.cpu_message,
        "verified": {"runs": verification.runs, "reproduced": verification.reproduced},
    }


def _report_inputs(
    outcome: Outcome,
    failure: Failure,
    environment: Environment,
    verification: Verification,
    seconds: float,
) -> ReportInputs:
    return ReportInputs(
        code=outcome.code,
        failure=failure,
        environment=environment,
        statements=outcome.statements,
        tensor_elements=outcome.tensor_elements,
        checks=outcome.checks,
        seconds=seconds,
        verified_runs=verification.runs,
        verified_reproduced=verification.reproduced,
        cpu_reproduces=outcome.cpu_reproduces,
        cpu_message=outcome.cpu_message,
        reproduced_from_capture=outcome.reproduced_from_capture,
        sidecar=outcome.sidecar,
    )


# --- walk-back --------------------------------------------------------------------------------


def _source_finish(failure: Failure) -> Any:
    """What a source reduction does to its result, for each accepted script alike."""
    if not failure.script:
        return None
    from reprocut.source.recorded import pin_script_dir
    from reprocut.source.reducer import ending_with_a_sync

    folder = Path(failure.script).resolve().parent
    return lambda code: pin_script_dir(ending_with_a_sync(code), folder)


def _walk_back(
    log: AcceptedLog,
    outcome: Outcome,
    verification: Verification,
    failure: Failure,
    inputs: dict[str, Any],
    environment: Environment,
    options: argparse.Namespace,
    out: Path,
    console: Console,
) -> tuple[Outcome, Verification, WalkBack]:
    """The final repro does not verify: write the latest accepted candidate that does."""
    print_phase(console, "repro.py does not verify: walking back through the accepted candidates")
    timeout = options.timeout * 2
    header = Header(expected=failure.signature, message=failure.error.message,
                    assertion=_assertion(failure), environment=environment)  # fmt: skip
    seen: dict[Path, Verification] = {}

    def reproduces(script: Path) -> bool:
        found = run_plain(script, timeout=timeout).signature
        return found is not None and found.matches(failure.signature, compare_op=False)

    def verifies(script: Path) -> bool:
        seen[script] = verify(script, failure.signature, runs=options.runs, timeout=timeout)
        return seen[script].exit_code == ExitCode.OK

    walked = walk_back(
        log, reproduces=reproduces, verifies=verifies, render=renderer(header), inputs=inputs
    )
    if walked.chosen is None:
        return outcome, verification, walked
    code = install(walked.chosen, out)
    case = walked.chosen.case
    chosen = replace(
        outcome,
        code=code,
        statements=count_statements(code) or outcome.statements,
        tensor_elements=None if case is None else case.total_numel(),
        sidecar=SIDECAR_NAME in code,
    )
    return chosen, seen[walked.chosen.path], walked


# --- case-level shrinking ----------------------------------------------------------------------


def _expected(case: ReproCase, failure: Failure) -> Signature:
    return case.expected or failure.signature


def pick_case(
    failure: Failure, inputs: dict[str, Any], oracle: Oracle
) -> tuple[ReproCase | None, list[Verdict]]:
    """The first case (most public first) that reproduces from its captured inputs."""
    verdicts = []
    for case in failure.cases:
        case, verdict = reproducing_form(oracle, case, inputs, _expected(case, failure))
        verdicts.append(verdict)
        if isinstance(verdict, Reproduced):
            return case, verdicts
    return None, verdicts


def on_cpu(case: ReproCase) -> ReproCase:
    for path, spec in list(case.tensors()):
        if spec.device != "cpu":
            case = case.with_arg(path, replace(spec, device="cpu"))
    return case


def cpu_behaviour(
    case: ReproCase, inputs: dict[str, Any], oracle: Oracle
) -> tuple[bool | None, str]:
    """Does the same call fail on the CPU too, and with which message?"""
    if all(spec.device == "cpu" for _, spec in case.tensors()):
        return True, ""
    verdict = oracle.check_case(on_cpu(case), inputs, expected=None)
    if isinstance(verdict, (OtherFailure, Reproduced)):
        return True, f"{verdict.signature.error_type}: {verdict.message.strip().splitlines()[0]}"
    if isinstance(verdict, Passed):
        return False, "runs without error"
    return None, type(verdict).__name__


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
    options: argparse.Namespace,
    out: Path,
    environment: Environment,
    on_event: Any,
) -> Outcome:
    header = Header(
        expected=failure.signature,
        message=failure.error.message,
        assertion=_assertion(failure),
        environment=environment,
    )
    case, _ = pick_case(failure, inputs, oracle)
    if case is None:
        emitted = write_case(failure.cases[0], inputs, out, header)
        return Outcome(
            code=emitted.code,
            statements=emitted.statements,
            tensor_elements=failure.cases[0].total_numel(),
            checks=oracle.checks,
            sidecar=bool(emitted.sidecar_keys),
            reproduced_from_capture=False,
        )
    expected = _expected(case, failure)

    def predicate(candidate: ReproCase) -> bool:
        return isinstance(oracle.check_case(candidate, inputs, expected=expected), Reproduced)

    def save(best: ReproCase) -> None:
        """Every accepted case goes to disk: an interrupted shrink keeps its best repro."""
        atomic_write(out / BEST_FILE, best.dumps())
        atomic_write(out / "repro.py", write_case(best, inputs, out, header).code)

    shrinker = Shrinker(
        case,
        predicate,
        passes=PASSES,
        inputs=inputs,
        max_checks=options.max_checks,
        max_time=options.max_time,
        on_event=on_event,
        on_accept=save,
        cpu_visible=expected.error_code is None,
    )
    try:
        best = shrinker.run()
    except KeyboardInterrupt:
        raise ShrinkInterruptedError(
            f"interrupted: the best case so far is in {out / 'repro.py'} (not verified)"
        ) from None
    save(best)
    cpu_reproduces, cpu_message = cpu_behaviour(best, inputs, oracle)
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
    )


def _assertion(failure: Failure) -> str:
    for assertion in failure.error.assertions:
        if isinstance(assertion, dict) and assertion.get("condition"):
            return str(assertion["condition"])
    return ""


# --- source-level reduction ----------------------------------------------------------------------


def shrink_source(
    failure: Failure, oracle: Oracle, options: argparse.Namespace, on_event: Any
) -> Outcome:
    """Custom kernels and --source: reduce the user's script (reprocut.source.recorded)."""
    try:
        from reprocut.source.recorded import pin_script_dir, reduce_recorded
    except ImportError as exc:
        raise SourceReducerMissingError(
            "source-level reduction is not available in this installation",
            hint="reprocut.source.reducer is missing; shrink without --source",
        ) from exc
    if not failure.script:
        raise NotReproducedError(
            "the recording does not name the original script",
            hint="record it again with `reprocut record your_script.py`",
        )
    # reduce_recorded finds the failing call in the script or its sibling modules and probes
    # the tensors reaching it, so they can stand in for the model and data pipeline.
    result = reduce_recorded(
        failure,
        oracle=oracle,
        max_checks=options.max_checks,
        max_time=options.max_time,
        on_event=on_event,
    )
    return Outcome(
        code=pin_script_dir(result.code, Path(failure.script).resolve().parent),
        statements=result.statements,
        tensor_elements=None,
        checks=result.checks,
        sidecar=False,
    )
