"""What every localization strategy shares: its options, and the Failure it writes.

Takes the options `localize` was called with and a child's outcome JSON (its error, stderr and
locations); hands on the ErrorInfo, Signature and SourceLocations read from them, and `finish`,
which stamps the script, argv, cwd and versions on a Failure and writes it to the run dir. The two
Failures that name no op (a plain script error, a failure not localized) are built here too,
since every strategy can end in one.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from reprocut.model.after_loop import AfterLoop
from reprocut.model.case import Signature, SourceLocation
from reprocut.model.failing_test import FailingTest
from reprocut.model.launch import Launch
from reprocut.model.notebook import source_line
from reprocut.model.recording import ErrorInfo, Failure, RunDir
from reprocut.model.signature import classify, cuda_error_code, parse_assertions
from reprocut.record.parent.runner import RunResult

Progress = Callable[[str], None]


class Rerunner(Protocol):
    """How a localization attempt runs the script again (rerun.py): without one, a single
    process; under torchrun, the whole job with one rank localizing (job_rerun.py)."""

    def __call__(self, attempt: str, **how: Any) -> RunResult: ...

    def describe(self, span: str) -> str:
        """The progress line for a rerun synchronized at `span` ("steps 3-5")."""
        ...


@dataclass(frozen=True, slots=True)
class LocalizeOptions:
    script: Path
    argv: tuple[str, ...]
    run_dir: RunDir
    cwd: Path
    timeout: float | None = None
    launch_blocking: bool = False
    snapshots: bool = True
    rerun: bool = True
    oracle: Any = None  # a warmed-up Oracle for snapshot replay, if the caller made one
    launch: Launch | None = None  # `-m`, argv[0] as typed, python options: reruns launch alike
    frameworks: tuple[tuple[str, str], ...] = ()  # versions the script imported (its outcome)
    nan: bool = False  # `--nan`: the first op that made a NaN/inf is the failure
    memory: bool = False  # `--memory`: the run had the memory watch on (memory.json)
    rerunner: Rerunner | None = None  # None: reruns run the script alone
    test: FailingTest | None = None  # under pytest: the first run's failing test


def environment_summary() -> dict[str, str]:
    """Versions only; never the user's environment variables (they may hold secrets)."""
    return {
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def location(data: dict[str, Any] | None) -> SourceLocation | None:
    """A location from the child, its line's text read from the file unless the child gave one
    (the end-of-script marker, a launch line read by line_sync)."""
    if not data:
        return None
    text = data.get("text", "") or source_line(data["file"], data["line"]) or ""
    if not text:
        try:
            lines = Path(data["file"]).read_text().splitlines()
            text = lines[data["line"] - 1].strip()
        except (OSError, IndexError):
            pass
    return SourceLocation(data["file"], data["line"], text, data.get("function", ""))


def error_info(error: dict[str, Any], stderr: str) -> ErrorInfo:
    code, name = cuda_error_code(error["message"])
    return ErrorInfo(
        type=error["type"],
        message=error["message"],
        code=error.get("code") if error.get("code") is not None else code,
        name=name,
        assertions=tuple(a.to_json() for a in parse_assertions(stderr)),
        surfaced_as=error.get("surfaced_as"),
    )


def signature_of(error: dict[str, Any], stderr: str, op: str | None) -> Signature:
    return classify(error["type"], error["message"], stderr, op, error.get("code"))


def finish(options: LocalizeOptions, failure: Failure) -> Failure:
    failure = replace(
        failure,
        script=str(options.script),
        argv=options.argv,
        cwd=str(options.cwd),
        env=environment_summary(),
        frameworks=dict(options.frameworks),
        run_module=options.launch.module if options.launch else None,
        test=options.test,
    )
    options.run_dir.write_failure(failure)
    return failure


def script_error(
    options: LocalizeOptions, first: RunResult, error: ErrorInfo, outcome: dict[str, Any] | None
) -> Failure:
    surfaced = location(outcome.get("surfaced_at")) if outcome else None
    after = AfterLoop.from_outcome(outcome, outcome.get("step")) if outcome else None
    return finish(
        options,
        Failure(
            status="script-error",
            error=error,
            signature=classify(error.type, error.message),
            step=outcome.get("step") if outcome and after is None else None,
            after_loop=after,
            phase=outcome.get("phase") if outcome else None,
            source=surfaced,
            surfaced_at=surfaced,
            loop=dict(outcome.get("loop") or {}) if outcome else {},
            localization="in-process",
            notes=("the script failed, but not inside a torch op",),
        ),
    )


def not_localized(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], why: str
) -> Failure:
    error = outcome["error"]
    hint = (
        ""
        if options.launch_blocking
        else "; try `reprocut record --launch-blocking`, or make the script deterministic (seeds)"
    )
    return finish(
        options,
        Failure(
            status="not-localized",
            error=error_info(error, first.stderr),
            signature=signature_of(error, first.stderr, outcome.get("last_op")),
            step=outcome.get("step"),
            phase=outcome.get("phase"),
            surfaced_at=location(outcome.get("surfaced_at")),
            source=location(outcome.get("surfaced_at")),
            localization="none",
            notes=(f"the first run failed, but {why}{hint}",),
        ),
    )
