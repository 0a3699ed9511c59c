"""After the shrink: plain-run agreement for its checks, the walk-back when repro.py does not
verify, and compute-sanitizer evidence for memory faults.

`agree` gives the oracle its plain-run confirmation (check/agreement.py) and the shrink its log
of accepted candidates (shrink/walkback.py); `walk_back_outcome` writes the latest accepted
candidate that verifies when the final one does not; `start_memcheck` runs repro.py under
compute-sanitizer beside its plain runs when the fault is a memory error (check/sanitizer.py; in
the memcheck started ahead, pipeline/ahead.py, when that is the same run), and
`memcheck_evidence` attaches what it found.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from reprocut.check.agreement import PlainAgreement
from reprocut.check.memcheck_process import MemcheckStandby
from reprocut.check.oracle import Oracle
from reprocut.check.sanitizer import Evidence, attach, evidence_for, run_memcheck, wants_evidence
from reprocut.check.verify import Verification, run_plain, verify
from reprocut.model.errors import ExitCode
from reprocut.model.recording import Failure, atomic_write
from reprocut.pipeline.cases import Outcome, failure_header
from reprocut.pipeline.cpu_check import NO_CPU_KERNEL
from reprocut.report.display.sanitizer import print_evidence
from reprocut.report.display.shrink import print_phase
from reprocut.shrink.emitter import SIDECAR_NAME, count_statements
from reprocut.shrink.header import Environment, Header, original_args
from reprocut.shrink.walkback import (
    ACCEPTED_DIR,
    AcceptedLog,
    WalkBack,
    install,
    renderer,
    walk_back,
)
from reprocut.source.speculation import default_slots


def agree(
    oracle: Oracle,
    failure: Failure,
    out: Path,
    *,
    source: bool,
    timeout: float,
    max_seconds: float | None = None,
) -> tuple[PlainAgreement, AcceptedLog]:
    """Plain runs for the oracle's process-sensitive candidates (`max_seconds` of them at
    most), and the accepted-candidate log. A script reduction starts from the user's script,
    which failed so in their own run."""
    finish = script_finish(failure)
    ahead, oracle.plain_ahead = oracle.plain_ahead, None  # record's, already importing torch
    agreement = PlainAgreement(
        ahead, timeout=timeout, finish=finish if source else None, max_seconds=max_seconds,
        captured=not source, beside=source,
    )  # fmt: skip
    oracle.confirm = agreement
    agreement.warm_up()
    log = AcceptedLog(out / ACCEPTED_DIR, finish=finish)
    if source and failure.script and Path(failure.script).is_file():
        original = Path(failure.script).read_text()
        log.start_source(unshrunk_script(failure))
        agreement.trust(original)
    return agreement, log


def unshrunk_script(failure: Failure) -> str:
    """The user's script as the first accepted candidate: runnable from accepted/."""
    from reprocut.source.recorded import with_script_dir_on_path

    script = Path(failure.script).resolve()
    return with_script_dir_on_path(script.read_text(), script.parent)


def script_finish(failure: Failure, *, formatted: bool = False) -> Callable[[str], str] | None:
    """What a source reduction does to its result (None: no script): a sync at its end and the
    script's folder pinned, for each accepted script alike; `formatted`: formatted too, as
    repro.py is when the finishing check takes both changes (reprocut.source.reducer,
    pipeline/scripts.py), which the verification started ahead runs."""
    if not failure.script:
        return None
    from reprocut.source.finish import ending_with_a_sync, format_code
    from reprocut.source.recorded import pin_script_dir

    folder = Path(failure.script).resolve().parent
    layout = format_code if formatted else (lambda code: code)
    return lambda code: pin_script_dir(layout(ending_with_a_sync(code)), folder)


def walk_back_outcome(
    log: AcceptedLog,
    outcome: Outcome,
    verification: Verification,
    failure: Failure,
    inputs: dict[str, Any],
    environment: Environment,
    *,
    runs: int,
    timeout: float,
    out: Path,
    console: Console,
) -> tuple[Outcome, Verification, WalkBack | None]:
    """The final repro does not verify: write the latest accepted candidate that does."""
    if verification.exit_code == ExitCode.OK or not outcome.reproduced_from_capture:
        return outcome, verification, None
    print_phase(console, "repro.py does not verify: walking back through the accepted candidates")
    header = walk_back_header(log, outcome, failure, environment)
    render = renderer(header)
    seen: dict[Path, Verification] = {}

    def reproduces(script: Path) -> bool:
        found = run_plain(script, timeout=timeout).signature
        return found is not None and found.matches(failure.signature, compare_op=False)

    def verifies(script: Path) -> bool:
        seen[script] = verify(script, failure.signature, runs=runs, timeout=timeout)
        return seen[script].exit_code == ExitCode.OK

    walked = walk_back(log, reproduces=reproduces, verifies=verifies, render=render,
                       inputs=inputs, ways=default_slots())  # fmt: skip
    walked = replace(walked, refused=_refused(outcome.code, verification, failure, out))
    if walked.chosen is None:
        return outcome, verification, walked
    case = walked.chosen.case
    if case is not None:  # rendered before, maybe under another header (the original's memcheck)
        walked.chosen.path.write_text(render(case, inputs)[0])
    code = install(walked.chosen, out)
    chosen = replace(
        outcome,
        code=code,
        statements=count_statements(code) or outcome.statements,
        tensor_elements=None if case is None else case.total_numel(),
        sidecar=SIDECAR_NAME in code,
    )
    return chosen, seen[walked.chosen.path], walked


def walk_back_header(
    log: AcceptedLog, outcome: Outcome, failure: Failure, environment: Environment
) -> Header:
    """The header of a walked-back case: the final repro's facts that hold for every accepted
    case, the unshrunk call's sizes and facts (`Original:`) and a CPU answer that was the
    target's (no CPU kernel); a CPU check of the final case says nothing of an earlier one."""
    header = failure_header(failure, environment)
    unshrunk = log.entries[0].case if log.entries else None
    if unshrunk is None:
        return header
    header = replace(header, original=original_args(unshrunk, failure.tensors))
    if outcome.cpu_message == f"{unshrunk.target} {NO_CPU_KERNEL}":
        header = replace(header, cpu_message=outcome.cpu_message)
    return header


REFUSED_FILE = "repro-refused.py"


def _refused(code: str, verification: Verification, failure: Failure, out: Path) -> dict[str, Any]:
    """The final repro that did not verify, kept as repro-refused.py, and what the first of
    its plain runs that did not fail so did instead."""
    atomic_write(out / REFUSED_FILE, code)
    missed = [
        run for run in verification.outcomes
        if run.signature is None or not run.signature.matches(failure.signature, compare_op=False)
    ]  # fmt: skip
    seen = missed[0] if missed else (verification.outcomes[0] if verification.outcomes else None)
    refused: dict[str, Any] = {"file": REFUSED_FILE, "verified": verification.describe()}
    if seen is not None:
        refused.update(
            exit=seen.returncode,
            signature=None if seen.signature is None else seen.signature.describe(),
            stderr_tail=seen.stderr_tail[-1500:],
        )
    return refused


def start_memcheck(
    pool: ThreadPoolExecutor,
    repro: Path,
    failure: Failure,
    *,
    timeout: float,
    standby: MemcheckStandby | None = None,
) -> Future[Evidence] | None:
    """memcheck on repro.py as written, beside its plain verification runs (it changes nothing
    they read; its findings are attached once they are done): 10-50 s saved on the H200.
    `standby`: the memcheck started ahead (pipeline/ahead.py), used if repro.py starts by importing
    torch and it filters the kernels this memcheck would; else ended now, and memcheck starts
    afresh."""
    wanted = wants_evidence(repro, failure.signature)
    if standby is not None and not (wanted and standby.fits(repro, kernel=failure.kernel)):
        standby.close()
        standby = None
    if not wanted:
        return None
    return pool.submit(run_memcheck, repro, timeout=timeout, kernel=failure.kernel, standby=standby)


def memcheck_evidence(
    repro: Path,
    failure: Failure,
    outcome: Outcome,
    *,
    timeout: float,
    console: Console,
    started: Future[Evidence] | None = None,
) -> tuple[Outcome, Evidence | None]:
    """A memory fault: memcheck names the access, thread and tensor (written into repro.py).
    `started`: memcheck already run on this very repro.py (start_memcheck); None: run it now."""
    if started is not None:
        evidence: Evidence | None = started.result()
        if evidence is not None:
            attach(repro, evidence)
    else:
        evidence = evidence_for(repro, failure.signature, timeout=timeout, kernel=failure.kernel)
    if evidence is None:
        return outcome, None
    print_evidence(console, evidence.to_json())
    return replace(outcome, code=repro.read_text()), evidence
