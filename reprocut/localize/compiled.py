"""The torch.compile verdict, and the Failure of a script that fails only compiled.

The recording ran the script eagerly; `run_compiled` ran it as the user did. Both together say
whether the failure needs the compiler. When it fails eagerly too, the eager Failure stands (its
op, line and repro) with the verdict beside it. When it fails only compiled, no op was recorded:
the Failure is the compiled run's error, at the deepest line of the user's code its traceback
shows (for a compiled region, `def forward`), and `shrink` reduces the script itself while it
fails compiled and passes eagerly (reprocut.pipeline.compiled).
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from reprocut.localize.failure import LocalizeOptions, error_info, finish, signature_of
from reprocut.model.case import Signature, SourceLocation
from reprocut.model.compiled import COMPILE_ONLY, CompiledRun, CompileVerdict
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.model.signature import crash_signature
from reprocut.record.parent.compiled_run import LOG
from reprocut.record.parent.runner import RunResult

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')


def compiler_versions() -> dict[str, str]:
    """torch and triton, as a compiler bug report names them."""
    versions = {"torch": torch.__version__}
    for name in ("triton", "pytorch-triton"):
        try:
            versions["triton"] = importlib.metadata.version(name)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def verdict(
    outcome: dict[str, Any] | None, compiled: CompiledRun | None, eager: Failure | None
) -> CompileVerdict | None:
    """The verdict for a recording whose script used torch.compile (None if it did not)."""
    used = tuple((outcome or {}).get("compiled") or ())
    if not used:
        return None
    settings = {str(k): str(v) for k, v in ((outcome or {}).get("inductor_settings") or {}).items()}
    return CompileVerdict(
        used=used,
        fails_eagerly=None if compiled is None else eager is not None,
        eager="" if eager is None else eager_summary(eager),
        compiled=compiled,
        inductor_settings=settings,
        versions=compiler_versions(),
        first_calls={
            str(k): tuple(v) for k, v in ((outcome or {}).get("compiled_calls") or {}).items()
        },
    )


def eager_summary(failure: Failure) -> str:
    """ "IndexError in aten::embedding at train.py:31": the eager failure in one line."""
    where = failure.op or failure.public_call or failure.kernel
    text = failure.error.type + (f" in {where}" if where else "")
    if failure.source is not None:
        text += f" at {Path(failure.source.file).name}:{failure.source.line}"
    return text


def with_compile_verdict(
    options: LocalizeOptions, first: RunResult, compiled: CompiledRun | None, failure: Failure
) -> Failure:
    """The eager Failure with the verdict beside it (the notes say which way it went)."""
    found = verdict(first.outcome, compiled, failure)
    if found is None:
        return failure
    notes = failure.notes  # "the script ran eagerly for localization": the verdict says more
    if compiled is not None:
        notes = tuple(n for n in notes if not n.startswith("torch.compile was used"))
    failure = replace(failure, torch_compile=found, notes=notes)
    options.run_dir.write_failure(failure)
    return failure


def compile_only(options: LocalizeOptions, first: RunResult, compiled: CompiledRun) -> Failure:
    """The Failure of a script that passed eagerly and failed compiled."""
    found = verdict(first.outcome, compiled, None)
    assert found is not None  # only called when the script used torch.compile
    stderr = (options.run_dir.path / LOG).read_text(errors="replace")
    if compiled.crashed or compiled.error_type is None:
        signature: Signature = crash_signature(compiled.returncode or 1)
        error = ErrorInfo(type=signature.error_type, message=compiled.describe())
    else:
        raised = {"type": compiled.error_type, "message": compiled.message}
        signature = signature_of(raised, stderr, None)
        error = error_info(raised, stderr)
    frames = user_frames(stderr, options)
    device = "cuda" if error.code is not None or "cuda" in stderr.lower() else "cpu"
    return finish(
        options,
        Failure(
            status=COMPILE_ONLY,
            error=error,
            signature=signature,
            kernel=compiled.kernel,
            source=frames[-1] if frames else None,
            call_site=frames[-2] if len(frames) > 1 else None,  # the call of the compiled code
            localization="compiled run",
            device=device,
            torch_compile=found,
        ),
    )


def user_frames(stderr: str, options: LocalizeOptions) -> list[SourceLocation]:
    """The frames of the user's own files in the compiled run's (last) traceback: the deepest
    is the compiled function (`def forward`), the one before it the call that ran it."""
    folders = {str(options.script.resolve().parent), str(options.cwd.resolve())}
    found: list[SourceLocation] = []
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            found = []  # chained exceptions: the last traceback is the one raised
        match = _FRAME.match(line)
        if not match:
            continue
        path = Path(match["file"])
        if not path.is_absolute():
            path = options.cwd / path
        if "site-packages" in str(path) or str(path.resolve().parent) not in folders:
            continue
        text = lines[i + 1].strip() if i + 1 < len(lines) else ""
        found.append(
            SourceLocation(str(path.resolve()), int(match["line"]), text, match["function"])
        )
    return found
