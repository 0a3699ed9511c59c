"""A recording ▶ a shrunk, verified repro.py and report.md: what `reprocut shrink` does, and
`reprocut record --shrink` after its recording.

Reads the recording, shrinks its captured call (or, for custom kernels and --source, the
script), writes repro.py, verifies it with plain `python repro.py` runs and writes report.md.
What does not depend on each other runs at once: the fork server starts (it imports torch) while
the recording is read (which imports torch too), the environment is gathered beside both, and
the plain verification runs go side by side, with compute-sanitizer beside them for a memory
fault, their processes started with the shrink to import torch meanwhile (pipeline/ahead.py).
Each phase's seconds go to meta.json and `--json`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from reprocut.check.oracle import Oracle
from reprocut.check.verify import Verification, verify
from reprocut.model.compiled import COMPILE_ONLY
from reprocut.model.errors import ExitCode, ReprocutError
from reprocut.model.limits import FIXED_POINT
from reprocut.model.recording import Failure, RunDir, atomic_write
from reprocut.pipeline.ahead import start_ahead, warm_for
from reprocut.pipeline.cases import Outcome, definitions_code, with_definitions
from reprocut.pipeline.compiled import shrink_compile_only
from reprocut.pipeline.declined import Declined
from reprocut.pipeline.finish import report_inputs, result_json, with_repro_message
from reprocut.pipeline.first_check import FirstCheck
from reprocut.pipeline.inputs import load_inputs
from reprocut.pipeline.phases import FORK_SERVER, READ, REPORT, VERIFY, Phases
from reprocut.pipeline.recover import (
    agree,
    memcheck_evidence,
    script_finish,
    start_memcheck,
    walk_back_outcome,
)
from reprocut.pipeline.request_repro import (
    PATH_EMPTY_INPUTS,
    PATH_SHRINK,
    PATH_SOURCE,
    RequestRepro,
    applies,
    request_repro,
)
from reprocut.pipeline.same_bug import (
    same_bug_after_verification,
    start_case_memcheck,
    start_original_memcheck,
    start_script_memcheck,
    stopped_note,
)
from reprocut.pipeline.settings import STANDBY_DEPTH, ShrinkSettings, limits_json
from reprocut.pipeline.verify_ahead import offering, start_verify_ahead, went_ahead_verification
from reprocut.pipeline.ways import Shrinking, make_repro
from reprocut.report.display.console import print_line
from reprocut.report.display.shrink import print_phase, shrink_display
from reprocut.report.markdown import collect_environment, render
from reprocut.shrink.header import Environment, Header
from reprocut.shrink.walkback import renderer
from reprocut.source.checks import preload_imports


class NothingToShrinkError(ReprocutError):
    slug = "script-error"
    exit_code = ExitCode.SCRIPT_ERROR


@dataclass(frozen=True, slots=True)
class Shrunk:
    """The result object (`--json`), what it says in words, and the exit code."""

    result: dict[str, Any]
    signature_text: str
    reproduced_from_capture: bool
    exit_code: ExitCode


def shrink_recording(
    run_dir: RunDir,
    settings: ShrinkSettings,
    console: Console,
    *,
    show: bool,
    failure: Failure | None = None,
    oracle: Oracle | None = None,
) -> Shrunk:
    """Shrink and verify `run_dir`'s failure (`failure`: already read). `oracle`: one that is
    warm already (record's, with torch imported and a CUDA child standing by), used for the
    captured call's checks; it is closed here either way."""
    started = time.monotonic()
    failure = failure or run_dir.read_failure()
    if failure.status == COMPILE_ONLY:  # no op recorded: the script, compiled, is reduced
        if oracle is not None:
            oracle.close(wait=False)
        return _compile_only(run_dir, failure, settings, console)
    with shrink_display(console, enabled=show) as shown, contextlib.ExitStack() as cleanup:
        phases = Phases(shown)
        with phases.phase(READ):
            _refuse(failure, settings)
        declined_before: tuple[Declined, ...] = ()
        environment = None
        if applies(failure) and not settings.source:
            fast = _request_repro(run_dir, failure, settings, phases, console)
            if fast is not None and fast.verified:
                if oracle is not None:
                    oracle.close(wait=False)
                return _finish(
                    run_dir, failure, settings, phases, started,
                    outcome=fast.outcome, verification=fast.verification,
                    environment=fast.environment, notes=(fast.note(),), path=PATH_EMPTY_INPUTS,
                )  # fmt: skip
            if fast is not None:
                environment = fast.environment
                declined_before = (Declined("torch.empty inputs", fast.fallback_note()),)
                print_line(console, f"[yellow]note[/]: {fast.fallback_note()}")
        source = _is_source(failure, settings)
        with phases.phase(READ):
            oracle = _fit_oracle(oracle, failure, settings)
            _start_server(oracle, phases, started)  # while the inputs are read
            # the cases with the code registering any custom op they call: read once, here
            defined = None if source else with_definitions(failure)
            ahead = start_ahead(failure, settings.runs, _out(run_dir, settings), cleanup,
                                warm=warm_for(failure, defined))  # fmt: skip
            agreement, log = agree(oracle, failure, _out(run_dir, settings), source=source,
                                   timeout=settings.timeout * 2,
                                   max_seconds=settings.plain_seconds(failure, script=source))  # fmt: skip
            on_event = log.watch(shown)
            preload_definitions(oracle, defined)
            first = _first_check(oracle, defined, run_dir)
            try:
                inputs, environment = _read(run_dir, failure, settings, environment)
            except BaseException:
                oracle.close(wait=False)
                raise
        # a script reduction's original memcheck needs no candidate: it runs beside the reduction;
        # a captured call's, once the shrink has logged the unshrunk case
        render_case = renderer(Header(expected=failure.signature, environment=environment))
        script_memcheck = start_script_memcheck(
            _out(run_dir, settings), failure, timeout=settings.timeout * 3
        ) if source else None  # fmt: skip
        case_memcheck = None if source else start_case_memcheck(
            _out(run_dir, settings), log, failure, render_case, inputs, timeout=settings.timeout * 3
        )  # fmt: skip
        verify_ahead = start_verify_ahead(
            _out(run_dir, settings), failure.signature, failure.device, runs=settings.runs,
            timeout=settings.timeout * 2, memcheck_timeout=settings.timeout * 3,
            standbys=ahead.plain, kernel=failure.kernel,
        )  # fmt: skip
        if verify_ahead is not None:
            cleanup.callback(verify_ahead.close)
            on_event = offering(on_event, verify_ahead, finish_script=script_finish(failure, formatted=True),
                                render_case=partial(render_case, inputs=inputs))  # fmt: skip
        shrinking = Shrinking(
            run_dir, failure, inputs, environment, oracle, settings, phases, on_event, console,
            out=_out(run_dir, settings), source=source, log=log,
            agreement=agreement, first=first, defined=defined,
        )  # fmt: skip
        try:
            outcome, declined = make_repro(shrinking)
        finally:
            oracle.close(wait=False)  # its processes end while the plain runs start
            agreement.close()
        limit = settings.time_limit()
        for note in stopped_note(outcome.stopped, limit, settings.max_checks):
            print_line(console, f"[yellow]note[/]: {note}")
        if oracle.fork_disabled:
            print_line(
                console, f"[yellow]note[/]: checks ran in fresh processes ({oracle.fork_disabled})"
            )
        out = _out(run_dir, settings)
        repro = out / "repro.py"
        atomic_write(repro, outcome.code)
        print_phase(console, f"verifying: {settings.runs} plain runs of python {repro.name}")
        went_ahead = verify_ahead.take(outcome.code) if verify_ahead is not None else None
        with ThreadPoolExecutor(max_workers=2) as pool:
            if went_ahead is not None and went_ahead.memcheck is not None:
                if ahead.memcheck is not None:
                    ahead.memcheck.close()
                memcheck = went_ahead.memcheck_for(repro)
            else:
                memcheck = start_memcheck(pool, repro, failure, timeout=settings.timeout * 3,
                                          standby=ahead.memcheck)  # fmt: skip
            original = start_original_memcheck(
                pool, repro, failure, log, source=outcome.from_script, render=render_case,
                inputs=inputs, timeout=settings.timeout * 3, started=script_memcheck,
                started_case=case_memcheck,
            )  # fmt: skip
            with phases.phase(VERIFY):
                verification = went_ahead_verification(went_ahead)
                if verification is None:
                    verification = verify(
                        repro, failure.signature, runs=settings.runs,
                        timeout=settings.timeout * 2, standbys=ahead.standbys_for(repro),
                    )  # fmt: skip
            outcome, verification, walked = walk_back_outcome(
                log, outcome, verification, failure, inputs, environment, runs=settings.runs,
                timeout=settings.timeout * 2, out=out, console=console,
            )  # fmt: skip
            outcome, evidence = memcheck_evidence(
                repro, failure, outcome, timeout=settings.timeout * 3, console=console,
                started=memcheck if walked is None else None,  # walked back: another repro.py
            )  # fmt: skip
            outcome, verification, evidence, same = same_bug_after_verification(
                failure, outcome, verification, evidence, original, log, render_case, inputs,
                runs=settings.runs, timeout=settings.timeout * 3, out=out, console=console,
            )  # fmt: skip
        declined = (*declined_before, *declined)
        extra: dict[str, Any] = {"agreement": agreement.to_json()}
        extra["declined"] = [way.to_json() for way in declined]
        if walked is not None:
            extra["walk_back"] = walked.to_json()
        if evidence is not None:
            extra["sanitizer"] = evidence.to_json()
        extra["same_bug"] = same.to_json()
        extra["stopped"] = outcome.stopped
        extra["fixed_point"] = outcome.stopped == FIXED_POINT  # else a limit ended it
        extra["cpu_checked_beside"] = outcome.cpu_checked_beside  # cpu_check then took ~0 s
        if oracle.server_seconds:  # what the fork_server phase was made of
            extra["fork_server"] = oracle.server_seconds
        extra["limits"] = limits_json(settings)
        notes = tuple(way.reason for way in declined)
        if outcome.from_script and notes:  # the last way that declined handed over to it
            notes = (*notes[:-1], f"{notes[-1]} (the script was reduced instead)")
        notes += (walked.describe(),) if walked is not None else ()
        notes += stopped_note(outcome.stopped, limit, settings.max_checks)
        return _finish(
            run_dir, failure, settings, phases, started,
            outcome=outcome, verification=verification, environment=environment,
            notes=notes, path=PATH_SOURCE if outcome.from_script else PATH_SHRINK,
            sanitizer="" if evidence is None else evidence.markdown(), extra=extra,
            same_bug=same.markdown(),
        )  # fmt: skip


def _finish(
    run_dir: RunDir,
    failure: Failure,
    settings: ShrinkSettings,
    phases: Phases,
    started: float,
    *,
    outcome: Outcome,
    verification: Verification,
    environment: Environment,
    notes: tuple[str, ...],
    path: str,
    sanitizer: str = "",
    extra: dict[str, Any] | None = None,
    same_bug: str = "",
) -> Shrunk:
    """report.md, the result (`--json`, with the path the repro was made by), meta.json."""
    out = _out(run_dir, settings)
    repro, report = out / "repro.py", out / "report.md"
    seconds = time.monotonic() - started
    with phases.phase(REPORT):
        outcome = with_repro_message(repro, outcome, failure, verification)
        written = replace(
            report_inputs(outcome, failure, environment, verification, seconds),
            notes=notes,
            sanitizer=sanitizer,
            same_bug=same_bug,
        )
        atomic_write(report, render(written))
    result = result_json(outcome, failure.signature, verification, repro, report, seconds)
    result["path"] = path
    result.update(extra or {})
    result["phases"] = phases.to_json()
    _write_meta(run_dir, result)
    exit_code = verification.exit_code if outcome.reproduced_from_capture else None
    return Shrunk(
        result,
        failure.signature.describe(),
        outcome.reproduced_from_capture,
        exit_code if exit_code is not None else ExitCode.NOT_REPRODUCED,
    )


def _compile_only(
    run_dir: RunDir, failure: Failure, settings: ShrinkSettings, console: Console
) -> Shrunk:
    print_phase(console, "fails only under torch.compile: reducing the script while it fails "
                "compiled and passes with TORCH_COMPILE_DISABLE=1 (two runs per candidate)")  # fmt: skip
    shrunk = shrink_compile_only(run_dir, failure, out=_out(run_dir, settings),
                                 max_checks=settings.max_checks, max_time=settings.max_time,
                                 timeout=settings.timeout, runs=settings.runs)  # fmt: skip
    shrunk.result["path"] = PATH_SOURCE  # the script, reduced (compiled)
    shrunk.result["limits"] = limits_json(settings)
    for note in stopped_note(shrunk.result["stopped"], settings.time_limit(), settings.max_checks):
        print_line(console, f"[yellow]note[/]: {note}")
    _write_meta(run_dir, shrunk.result)
    reproduced = shrunk.result["verified"]["reproduced"] > 0
    return Shrunk(shrunk.result, failure.signature.describe(), reproduced, shrunk.exit_code)


def _request_repro(
    run_dir: RunDir, failure: Failure, settings: ShrinkSettings, phases: Phases, console: Console
) -> RequestRepro | None:
    """The value-less repro of an out-of-memory whose request alone is too big, verified."""
    return request_repro(
        failure, _out(run_dir, settings), runs=settings.runs,
        timeout=settings.timeout * 2, phases=phases, console=console,
    )  # fmt: skip


def _start_server(oracle: Oracle, phases: Phases, started: float) -> None:
    """The fork server starts on a thread now; checks wait for it (its time counts from the
    shrink's start, so a server that record had started already costs nothing)."""
    if not oracle.fork:
        return

    def warm() -> None:
        try:
            oracle.warm_up()
        except Exception:  # the first check starts it again, or says why it cannot
            return
        phases.add(FORK_SERVER, time.monotonic() - started)
        with contextlib.suppress(Exception):  # with standby_cuda: the first check's child
            oracle.prepare()  # makes its CUDA context meanwhile

    threading.Thread(target=warm, daemon=True).start()


def preload_definitions(oracle: Oracle, defined: Failure | None) -> None:
    """The installed packages a custom op's definitions import (triton, cupy, the torch.library
    machinery that imports torch._dynamo), imported once by the fork server instead of by every
    check of its captured call: on the H200 a triton_op's captured call took 3.3 s a check, 78
    checks, with them imported in each."""
    if defined is None or not oracle.fork:
        return
    code = definitions_code(defined)
    if not code:
        return
    path = oracle.workdir / "definitions.py"
    path.write_text(code)
    script = Path(defined.script).resolve() if defined.script else path
    preload_imports(oracle, path, Path(defined.cwd or script.parent), [], also=(script.parent,))


def _first_check(oracle: Oracle, defined: Failure | None, run_dir: RunDir) -> FirstCheck | None:
    """The first case's check, started now: it runs once the server is up, while this process
    still imports torch to read the inputs (its script loads them from inputs.pt itself).
    `defined`: the failure whose cases are shrunk (None for a script reduction)."""
    if not oracle.fork or defined is None:
        return None
    case = defined.cases[0]
    return FirstCheck(oracle, case, case.expected or defined.signature, run_dir.inputs_path)


def _out(run_dir: RunDir, settings: ShrinkSettings) -> Path:
    out = (settings.out or run_dir.path).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _is_source(failure: Failure, settings: ShrinkSettings) -> bool:
    return settings.source or failure.status == "outside-dispatcher" or not failure.cases


def _refuse(failure: Failure, settings: ShrinkSettings) -> None:
    if failure.status == "nonfinite-input":
        raise NothingToShrinkError(
            "the recorded NaN/inf was made by no op: it was already in the data or state "
            f"({failure.nonfinite.entered_as if failure.nonfinite else 'an input'})",
            hint="find where that tensor was filled (the data pipeline, a buffer update)",
        )
    if failure.status == "script-error" and not settings.source:
        raise NothingToShrinkError(
            f"the recorded failure is not in a torch op ({failure.error.type}: "
            f"{failure.error.message.strip().splitlines()[0] if failure.error.message.strip() else ''})",
            hint="fix the script error first; `--source` reduces the script anyway",
        )


def _read(
    run_dir: RunDir, failure: Failure, settings: ShrinkSettings, environment: Environment | None
) -> tuple[dict[str, Any], Environment]:
    """The captured inputs and the environment (gathered beside the inputs: both import torch,
    and the environment may ask nvidia-smi), unless the value-less repro gathered it already."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        gathered = pool.submit(collect_environment, failure) if environment is None else None
        inputs = {} if _is_source(failure, settings) else load_inputs(run_dir, failure)
        return inputs, environment if gathered is None else gathered.result()


def _fit_oracle(oracle: Oracle | None, failure: Failure, settings: ShrinkSettings) -> Oracle:
    """The oracle for this failure: record's warm one for a captured call, one of its own for a
    script reduction (the server the command started ahead, with the script's environment).
    Both keep children with their CUDA contexts made ahead of the checks; a script's candidate
    that may set the environment CUDA reads runs in a fresh child instead
    (reprocut.source.checks)."""
    source = _is_source(failure, settings)
    if oracle is not None and source:
        oracle.close(wait=False)
        oracle = None
    if oracle is None:
        oracle = Oracle(
            fork=settings.fork,
            timeout=settings.timeout,
            standby_cuda=failure.device.startswith("cuda"),
        )
    oracle.expected = failure.signature
    # children starting their CUDA contexts ahead, one alone if the failure is about memory,
    # which each waiting context takes some of
    oracle.standby_depth = 1 if failure.memory is not None else STANDBY_DEPTH
    return oracle


def _write_meta(run_dir: RunDir, result: dict[str, Any]) -> None:
    """The shrink's status, time and phases, next to record's in the run's meta.json."""
    try:
        meta = run_dir.read_meta()
    except ReprocutError:  # a hand-made or older recording: start one
        meta = {}
    meta["shrink"] = {
        key: result[key] for key in ("status", "path", "repro", "seconds", "checks", "phases")
    }
    run_dir.write_meta(meta)
