"""A failure only torch.compile shows ▶ the smallest script that still fails that way, compiled.

No op was recorded (the eager run passed), so the script itself is reduced (reprocut.source),
with a check that holds the compiler to account: a candidate counts when a plain run, compiled,
fails with the recorded signature *and* the same code run with TORCH_COMPILE_DISABLE=1 passes.
A candidate that drops the `torch.compile` call, or one that fails eagerly as well, is another
bug. The repro keeps the user's `torch.compile` call (public API) on the smallest function that
still fails; it is verified by plain runs, and once more with compile off, which must pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reprocut.check.plainrun import PlainRunner
from reprocut.check.verify import RunOutcome, Verification, run_plain, verify
from reprocut.model.case import Signature, TensorSpec, spec_from_json
from reprocut.model.compiled import compile_environment
from reprocut.model.errors import ExitCode
from reprocut.model.limits import FIXED_POINT
from reprocut.model.recording import Failure, RunDir, atomic_write
from reprocut.model.signature import crash_signature
from reprocut.pipeline.cases import Outcome
from reprocut.pipeline.finish import report_inputs, result_json
from reprocut.report.markdown import collect_environment, render
from reprocut.source.checks import candidate_path
from reprocut.source.compiled_call import compiled_call_candidates

EAGER_PASSES = "passes with TORCH_COMPILE_DISABLE=1"


@dataclass(frozen=True, slots=True)
class CompiledShrink:
    """What `shrink` of a compile-only failure gives: its `--json` result and exit code."""

    result: dict[str, Any]
    exit_code: ExitCode


class CompileOnlyCheck:
    """`check(code)` for the source reducer: the compiled run's signature when the candidate
    fails compiled with `expected` and passes eagerly; else what it did instead (or None)."""

    def __init__(self, script: Path, cwd: Path, argv: tuple[str, ...], expected: Signature,
                 timeout: float) -> None:  # fmt: skip
        self.path = candidate_path(script)
        self.cwd, self.argv, self.expected, self.timeout = cwd, argv, expected, timeout
        self.compiled = PlainRunner(_environment(compiled=True))
        self.eager = PlainRunner(_environment(compiled=False))
        self._lock = threading.Lock()  # one candidate file: one check at a time

    def __call__(self, code: str) -> Signature | None:
        with self._lock:
            self.path.write_text(code)
            compiled = _signature(self.compiled.run(self.path, argv=self.argv, cwd=self.cwd,
                                                    timeout=self.timeout))  # fmt: skip
            if compiled is None or not compiled.matches(self.expected):
                return compiled
            eager = self.eager.run(self.path, argv=self.argv, cwd=self.cwd, timeout=self.timeout)
            # failing eagerly as well, it is not a failure only the compiler shows, whatever
            # the eager error is: never the expected signature
            return compiled if eager.returncode == 0 else None

    def close(self) -> None:
        self.compiled.close()
        self.eager.close()
        self.path.unlink(missing_ok=True)


def shrink_compile_only(
    run_dir: RunDir,
    failure: Failure,
    *,
    out: Path,
    max_checks: int,
    max_time: float | None,
    timeout: float,
    runs: int,
    on_event: Callable[[Any], None] | None = None,
) -> CompiledShrink:
    """Reduce (first the jump to one call of the compiled function, then the fine passes to
    their fixed point; `max_time`: the user's limit, None: the safety cap), write repro.py,
    verify it compiled (and eagerly: it must pass), write report.md."""
    from reprocut.source.recorded import pin_script_dir
    from reprocut.source.reducer import reduce_source

    started = time.monotonic()
    script = Path(failure.script).resolve()
    cwd = Path(failure.cwd or script.parent)
    reduce_started = time.monotonic()
    check = CompileOnlyCheck(script, cwd, failure.argv, failure.signature, timeout * 2)
    name, specs = compiled_callee(failure)
    original = script.read_text()
    try:
        start = _jump(check, original, name, specs, failure.signature)
        reduced = reduce_source(
            script, cwd=cwd, argv=failure.argv, expected=failure.signature, check=check,
            max_checks=max_checks, max_time=max_time, on_event=on_event, timeout=timeout * 2,
            preload=False, code=start,
            specs=specs if start == original else (),  # the jump bound them already
            focus=failure.call_site.text if failure.call_site and start == original else None,
        )  # fmt: skip
    finally:
        check.close()
    reduce_seconds = time.monotonic() - reduce_started
    repro = out / "repro.py"
    code = pin_script_dir(reduced.code, script.parent)
    atomic_write(repro, code)
    verification = verify(repro, failure.signature, runs=runs, timeout=timeout * 2,
                          env=_environment(compiled=True))  # fmt: skip
    eager = run_plain(repro, timeout=timeout * 2, env=_environment(compiled=False))
    if eager.returncode != 0:  # it fails without the compiler too: not a compile-only repro
        verification = Verification(verification.runs, 0, verification.outcomes)
    outcome = Outcome(
        code=code,
        statements=reduced.statements,
        tensor_elements=None,
        checks=reduced.checks,
        sidecar=False,
        passes=tuple((name, count) for name, count in reduced.accepted if count),
        from_script=True,
        stopped=reduced.stopped,
    )
    seconds = time.monotonic() - started
    report = out / "report.md"
    eager_note = EAGER_PASSES if eager.returncode == 0 else f"fails eagerly too: {_said(eager)}"
    written = report_inputs(outcome, failure, collect_environment(failure), verification, seconds)
    atomic_write(report, render(replace(written, notes=(f"Without torch.compile: {eager_note}.",))))
    result = result_json(outcome, failure.signature, verification, repro, report, seconds)
    result["phases"] = {"source": round(reduce_seconds, 3),
                        "verify": round(seconds - reduce_seconds, 3)}  # fmt: skip
    result["compile_only"] = {"eager_passes": eager.returncode == 0, "eager": _said(eager)}
    result["stopped"] = reduced.stopped
    result["fixed_point"] = reduced.stopped == FIXED_POINT
    return CompiledShrink(result, verification.exit_code)


def compiled_callee(failure: Failure) -> tuple[str, tuple[TensorSpec | None, ...]]:
    """What was compiled and failed (the deepest user frame names it: `pooled_stats`, or
    `forward` of the one module compiled), and the specs of its first call's arguments."""
    verdict = failure.torch_compile
    calls = {} if verdict is None else verdict.first_calls
    function = failure.source.function if failure.source is not None else ""
    if function in calls:
        name = function
    elif len(calls) == 1:
        name = next(iter(calls))
    else:
        return "", ()
    return name, tuple(None if s is None else spec_from_json(s) for s in calls[name])


def _jump(
    check: CompileOnlyCheck,
    original: str,
    name: str,
    specs: tuple[TensorSpec | None, ...],
    expected: Signature,
) -> str:
    """The first candidate that calls the compiled function once and fails the same way, only
    compiled; else the script as it is."""
    if not name:
        return original
    for candidate in compiled_call_candidates(original, name, specs):
        found = check(candidate)
        if found is not None and found.matches(expected):
            return candidate
    return original


def _environment(*, compiled: bool) -> dict[str, str]:
    """A check's or verification's: torch.compile on or off, the rest as the user's (the
    kernel caches included: see check/childenv.py)."""
    return compile_environment(compiled=compiled)


def _signature(outcome: RunOutcome) -> Signature | None:
    if outcome.signature is not None:
        return outcome.signature
    if outcome.returncode:  # died without a traceback: an abort from a C++ kernel
        return crash_signature(outcome.returncode)
    return None


def _said(outcome: RunOutcome) -> str:
    if outcome.returncode == 0:
        return "passed"
    signature = _signature(outcome)
    return "timed out" if outcome.returncode is None else (
        signature.describe() if signature else f"exit code {outcome.returncode}"
    )  # fmt: skip
