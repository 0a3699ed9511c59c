"""Is repro.py the user's bug? The fingerprint check after the verification, and the walk-back
to the last accepted candidate whose fingerprint matches when it is not.

For a memory fault the original's fingerprint comes from memcheck on the unshrunk failure: the
user's script itself for a script reduction (only the faulting kernel instrumented when record
knows its name, so the steps before it run at nearly full speed), the captured call as recorded
(accepted/0000.py) for an op-level shrink. The script's starts with its reduction (it needs no
candidate), the captured call's beside the repro's own memcheck and the plain verification
runs, so neither costs wall time unless it is the slowest of what runs beside it; and no
candidate can have slid to another bug in it. Other classes keep their signature as the fingerprint: the
plain runs compare its error code or type and kind, the shrinker's checks the op.
"""

from __future__ import annotations

import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from reprocut.check.fingerprint import compare, memory_fingerprint
from reprocut.check.sanitizer import LOG_NAME, Evidence, attach, run_memcheck, wants_evidence
from reprocut.check.verify import Verification, verify
from reprocut.model.errors import ExitCode
from reprocut.model.fingerprint import (
    MemoryFingerprint,
    SameBug,
    signature_fingerprint,
    signature_parts,
)
from reprocut.model.limits import MAX_CHECKS, MAX_TIME, SAFETY_CAP_HIT, TimeLimit
from reprocut.model.recording import Failure
from reprocut.model.signature import is_memory_error
from reprocut.pipeline.cases import Outcome
from reprocut.pipeline.daemon import in_daemon_thread
from reprocut.report.display.shrink import print_phase
from reprocut.shrink.emitter import SIDECAR_NAME, count_statements
from reprocut.shrink.walkback import AcceptedLog, Entry, Render, WalkBack, install, walk_back
from reprocut.source.speculation import default_slots

ORIGINAL_LOG = "sanitizer-original.log"
ORIGINAL_THREAD = "reprocut-original-memcheck"
PLAIN_ONLY = "op: a plain run cannot see which op raised (the shrinker's checks compared it)"


def start_script_memcheck(
    out: Path, failure: Failure, *, timeout: float
) -> Future[Evidence] | None:
    """memcheck on the user's script, started as its reduction starts (None: not a memory fault
    on the GPU, or no script). A script reduction's original is the script itself, known before
    any candidate: its memcheck (the whole training run, the faulting kernel instrumented) then
    runs beside the reduction instead of after it, where it was the last thing a CuPy shrink
    waited for on the H200 (8-10 s after its verification)."""
    script = Path(failure.script) if failure.script else None
    if script is None or not script.is_file():
        return None
    if not (is_memory_error(failure.signature) and failure.device.startswith("cuda")):
        return None
    out.mkdir(parents=True, exist_ok=True)
    return in_daemon_thread(lambda: run_memcheck(
        script.resolve(), timeout=timeout, kernel=failure.kernel, argv=list(failure.argv),
        cwd=Path(failure.cwd or script.resolve().parent), log=out / ORIGINAL_LOG,
    ), name=ORIGINAL_THREAD)  # fmt: skip


def start_case_memcheck(
    out: Path,
    log: AcceptedLog,
    failure: Failure,
    render: Render,
    inputs: dict[str, Any],
    *,
    timeout: float,
) -> Future[Evidence] | None:
    """memcheck on a captured call's unshrunk case, started once the shrink has logged it (None:
    not a memory fault on the GPU). It ran beside the verification before, and with the repro's
    own memcheck and three plain runs there it ended 5.9-7.9 s after them on the H200 (the
    op-level shrinks of faults-cuda.md); the reduction's checks are not slowed by a memcheck
    beside them (memcheck-probe-cuda.md)."""
    if not (is_memory_error(failure.signature) and failure.device.startswith("cuda")):
        return None
    future: Future[Evidence] = Future()

    def start(entry: Entry) -> None:
        if entry.case is None:  # the user's script: the op-level path declined before its case
            return  # (its memcheck, from its own folder with its arguments, is the verification's)

        def work() -> Evidence:
            first = log.script(entry, render, inputs)
            out.mkdir(parents=True, exist_ok=True)
            return run_memcheck(
                first, timeout=timeout, kernel=failure.kernel, log=out / ORIGINAL_LOG
            )

        future.set_running_or_notify_cancel()  # begun: start_original_memcheck may take it
        in_daemon_thread(work, future, name=ORIGINAL_THREAD)

    log.on_first = start
    return future


def start_original_memcheck(
    pool: ThreadPoolExecutor,
    repro: Path,
    failure: Failure,
    log: AcceptedLog,
    *,
    source: bool,
    render: Render,
    inputs: dict[str, Any],
    timeout: float,
    started: Future[Evidence] | None = None,
    started_case: Future[Evidence] | None = None,
) -> Future[Evidence] | None:
    """memcheck on the unshrunk failure, beside the verification (None: not a memory fault).
    `started`: the script's, begun with its reduction (start_script_memcheck); `started_case`:
    the captured call's, begun once the shrink logged it (start_case_memcheck)."""
    if not wants_evidence(repro, failure.signature):
        return None
    if source and started is not None:
        return started
    if not source and started_case is not None and (started_case.running() or started_case.done()):
        return started_case
    if source and failure.script and Path(failure.script).is_file():
        return start_script_memcheck(repro.parent, failure, timeout=timeout)
    if not log.entries:
        return None
    first = log.script(log.entries[0], render, inputs)
    log_file = repro.with_name(ORIGINAL_LOG)
    return pool.submit(run_memcheck, first, timeout=timeout, kernel=failure.kernel, log=log_file)


def signature_same_bug(failure: Failure, verification: Verification) -> SameBug:
    """The other classes: the signature is the fingerprint, checked by the plain runs."""
    seen = next((o.signature for o in verification.outcomes if o.signature is not None), None)
    equal = verification.runs > 0 and verification.reproduced == verification.runs
    skipped = [PLAIN_ONLY] if failure.signature.op else []
    if not seen and not equal:
        skipped.append("the repro did not fail in its plain runs")
    differ = () if equal else (f"{verification.reproduced} of {verification.runs} plain runs failed as expected",)  # fmt: skip
    return SameBug("signature", signature_fingerprint(failure.signature),
                   signature_fingerprint(seen), equal, tuple(skipped), differ,
                   parts=signature_parts(failure.signature, seen))  # fmt: skip


def memcheck_same_bug(
    failure: Failure, original: Future[Evidence] | None, repro: Evidence | None
) -> SameBug:
    evidence = original.result() if original is not None else None
    return compare(evidence, repro, failure.signature.op)


def walk_back_to_fingerprint(
    log: AcceptedLog,
    outcome: Outcome,
    failure: Failure,
    target: MemoryFingerprint,
    *,
    render: Render,
    inputs: dict[str, Any],
    runs: int,
    timeout: float,
    out: Path,
    probes: dict[Path, Evidence] | None = None,
) -> tuple[Outcome, Verification | None, WalkBack]:
    """The latest accepted candidate whose memcheck fingerprint is the original's (one memcheck
    run a probe, a binary search) and that verifies; the repro is left as it is if none.
    `probes` gets each probed candidate's memcheck evidence, by its path."""
    seen: dict[Path, Verification] = {}
    probed = {} if probes is None else probes
    op = failure.signature.op

    def matches(script: Path) -> bool:
        if script.name == f"{0:04d}.py":  # the unshrunk failure: its fingerprint is the original
            return True
        probed[script] = run_memcheck(
            script, timeout=timeout, kernel=failure.kernel, log=script.with_suffix(".log")
        )
        found = memory_fingerprint(probed[script], op)
        return found is not None and target.same_bug(found)

    def verifies(script: Path) -> bool:
        seen[script] = verify(script, failure.signature, runs=runs, timeout=timeout)
        return seen[script].exit_code == ExitCode.OK

    walked = walk_back(log, reproduces=matches, verifies=verifies, render=render, inputs=inputs,
                       ways=default_slots())  # fmt: skip
    if walked.chosen is None:
        return outcome, None, walked
    code = install(walked.chosen, out)
    case = walked.chosen.case
    chosen = replace(outcome, code=code, statements=count_statements(code) or outcome.statements,
                     tensor_elements=None if case is None else case.total_numel(),
                     sidecar=SIDECAR_NAME in code)  # fmt: skip
    return chosen, seen[walked.chosen.path], walked


def recheck_after_walk_back(
    repro: Path, failure: Failure, original: Future[Evidence] | None, *, timeout: float,
    note: str, probed: Evidence | None = None,
) -> tuple[Evidence, SameBug]:  # fmt: skip
    """memcheck's findings on the repro written by the walk-back, attached: those of its probe
    when the walk-back ran memcheck on that very code (its log copied beside the repro), else
    from a run of its own (the unshrunk candidate is never probed)."""
    if probed is not None and probed.log is not None:
        saved = repro.with_name(LOG_NAME)
        shutil.copyfile(probed.log, saved)
        evidence = replace(probed, log=str(saved))
    else:
        evidence = run_memcheck(repro, timeout=timeout, kernel=failure.kernel)
    attach(repro, evidence)
    return evidence, replace(memcheck_same_bug(failure, original, evidence), note=note)


def stopped_note(stopped: str, limit: TimeLimit, max_checks: int) -> tuple[str, ...]:
    """A limit that ended the shrink before its fixed point, in words (nothing otherwise):
    the user's --max-time or --max-checks, or the safety cap under a run with neither."""
    limits = {
        MAX_TIME: f"{limit.seconds:.0f} s limit (--max-time)",
        SAFETY_CAP_HIT: f"{limit.seconds:.0f} s safety cap (no --max-time was given)",
        MAX_CHECKS: f"{max_checks}-check limit (--max-checks)",
    }
    if stopped not in limits:
        return ()
    larger = "a larger --max-time" if stopped == SAFETY_CAP_HIT else "a larger limit"
    return (
        f"The shrink stopped early, at its {limits[stopped]}, before its fixed point: "
        f"{larger} may give a smaller repro.",
    )


def same_bug_after_verification(
    failure: Failure,
    outcome: Outcome,
    verification: Verification,
    evidence: Evidence | None,
    original: Future[Evidence] | None,
    log: AcceptedLog,
    render: Render,
    inputs: dict[str, Any],
    *,
    runs: int,
    timeout: float,
    out: Path,
    console: Console,
) -> tuple[Outcome, Verification, Evidence | None, SameBug]:
    """The repro's fingerprint against the original's (None `original`: not a memory fault,
    the signature is the fingerprint); on a mismatch, the walk-back to the last accepted
    candidate whose fingerprint matches."""
    if original is None:
        return outcome, verification, evidence, signature_same_bug(failure, verification)
    same = memcheck_same_bug(failure, original, evidence)
    if same.equal is not False or same.original is None or len(log.entries) < 2:
        return outcome, verification, evidence, same
    print_phase(console, "repro.py is another memory fault: walking back to the original's")
    target = MemoryFingerprint.from_json(same.original)
    probes: dict[Path, Evidence] = {}
    chosen, verified, walked = walk_back_to_fingerprint(
        log, outcome, failure, target, render=render, inputs=inputs, runs=runs,
        timeout=timeout, out=out, probes=probes,
    )  # fmt: skip
    if walked.chosen is None or verified is None:
        note = f"walking back found no candidate with the original's fingerprint ({walked.reason})"
        return outcome, verification, evidence, replace(same, note=note)
    note = (f"walked back to accepted candidate {walked.chosen.index} of {walked.candidates - 1}: "
            "the latest whose memcheck fingerprint is the original's")  # fmt: skip
    repro = out / "repro.py"
    evidence, same = recheck_after_walk_back(
        repro, failure, original, timeout=timeout, note=note,
        probed=probes.get(walked.chosen.path),
    )  # fmt: skip
    return replace(chosen, code=repro.read_text()), verified, evidence, same
