"""compute-sanitizer evidence for a memory fault: the minimized repro run under memcheck.

An illegal address says only that some kernel touched memory it should not; memcheck says which
kernel, which thread and block, what access of what size and where, and the host backtrace down
to the launch. It costs 20-50x a plain run, so it runs on the shrunk repro only, once, with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 (the caching allocator would hide small overruns inside its own
blocks) and a timeout. A small wrapper runs the repro and writes down where its tensors live
(reprocut.check.memcheck_process), so the address can be named: "reads 4 B at 3.5 GiB before
the start of `x` (arg 0)". The process is started now, or was started ahead and has imported
torch while the shrink ran (`MemcheckStandby`); what it reports is read the same way.
Without compute-sanitizer there is a one-line note and nothing fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from reprocut.check import check_log
from reprocut.check.memcheck import (
    MemcheckError,
    MemcheckReport,
    TensorRange,
    describe,
    parse_report,
    useful_frames,
)
from reprocut.check.memcheck_process import (
    PRINT_LIMIT,
    MemcheckRun,
    MemcheckStandby,
    fresh_memcheck,
    kernel_options,
)
from reprocut.check.oracle import run_with_timeout
from reprocut.model.case import Signature
from reprocut.model.signature import is_memory_error

FALLBACK = Path("/usr/local/cuda/bin/compute-sanitizer")
LOG_NAME = "sanitizer.log"
HEADER_TITLE = "compute-sanitizer (memcheck):"
QUIET_SECONDS = 0.5  # the log unchanged this long: the errors printed so far are whole


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    return str(FALLBACK) if FALLBACK.is_file() and os.access(FALLBACK, os.X_OK) else None


@dataclass(frozen=True, slots=True)
class Evidence:
    """What memcheck said about the repro (status "found", "clean", "unavailable", "timeout",
    "cancelled")."""

    status: str
    note: str = ""
    report: MemcheckReport = field(default_factory=MemcheckReport)
    findings: tuple[str, ...] = ()  # the first access error, in words
    seconds: float = 0.0
    log: str | None = None  # the raw report, saved beside the repro
    kernel_filter: str | None = None  # only kernels named like this were checked
    stopped_early: bool = False  # stopped once it had printed PRINT_LIMIT errors (no total)
    tensors: tuple[TensorRange, ...] = ()  # where the script's tensors lived (names addresses)

    def header_lines(self) -> list[str]:
        """Lines for repro.py's docstring."""
        if self.status != "found":
            return [f"{HEADER_TITLE} {self.note}"] if self.note else []
        return [HEADER_TITLE, *(f"  {line}" for line in self.findings)]

    def markdown(self) -> str:
        if self.status != "found":
            return self.note
        body = "\n".join(self.findings)
        only = f", checking kernels named like `{self.kernel_filter}`" if self.kernel_filter else ""
        return f"memcheck, run on repro.py with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`{only}:\n\n```\n{body}\n```"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "note": self.note,
            "findings": list(self.findings),
            "errors": [error.to_json() for error in self.report.errors[:5]],
            "error_count": self.report.summary,
            "seconds": round(self.seconds, 3),
            "log": self.log,
            "kernel_filter": self.kernel_filter,
            "stopped_early": self.stopped_early,
        }


def findings_of(
    report: MemcheckReport, tensors: list[TensorRange], *, stopped: bool = False
) -> tuple[str, ...]:
    """The report in a few lines: the first access error in words, then what else it saw
    (`stopped`: memcheck was stopped once it had printed all it would, so no total)."""
    first = report.first_access
    lines: list[str] = []
    if first is not None:
        lines.append(f"{first.title} in {first.kernel or 'an unnamed kernel'}")
        where = _where(first)
        lines.append(f"{where}{describe(first, tensors)}")
        frames = useful_frames(first.host_frames)
        if frames:
            lines.append("host: " + " < ".join(frames[:4]))
    api = [e for e in report.errors if e.api_error is not None]
    if api and first is None:
        name, code, text = api[0].api_error  # type: ignore[misc]
        lines.append(f"the program hit {name} (error {code}, {text})")
    if report.summary:
        lines.append(f"{report.summary} error(s) in all")
    elif stopped:
        lines.append(f"at least {len(report.errors)} errors (memcheck stopped after printing them)")
    return tuple(lines)


def _where(error: MemcheckError) -> str:
    if error.thread is None or error.block is None:
        return ""
    thread = ",".join(map(str, error.thread))
    block = ",".join(map(str, error.block))
    return f"thread ({thread}) in block ({block}): "


def run_memcheck(
    repro: Path,
    *,
    timeout: float = 180.0,
    sanitizer: str | None = None,
    kernel: str | None = None,
    argv: Sequence[str] = (),
    cwd: Path | None = None,
    log: Path | None = None,
    standby: MemcheckStandby | None = None,
    cancel: threading.Event | None = None,
) -> Evidence:
    """Run `python repro` under `compute-sanitizer --tool memcheck`; never raises for its outcome.

    `kernel`: the faulting kernel's name, when known (a custom kernel's). Only kernels whose
    name contains it are instrumented then (`--kernel-name kns=`): the repro's other kernels (a
    1 GB `randn` or two) run at full speed. If that finds no access error (another kernel
    faulted, or the filter is not understood), memcheck runs again over every kernel, in a
    process started then. `argv`, `cwd`: a user's script's arguments and folder; `log`: where
    memcheck's report is kept (default: sanitizer.log beside the repro). `standby`: a memcheck
    started ahead, torch imported, that runs the first memcheck if it `fits` (else it is left
    to its owner to close). `cancel`: set, it stops memcheck at once ("cancelled")."""
    exe = sanitizer or find_sanitizer()
    if exe is None:
        return Evidence(
            "unavailable", "compute-sanitizer is not on PATH: no memory-checker evidence"
        )
    repro = repro.resolve()
    where = _Where(tuple(argv), (cwd or repro.parent).resolve(), log or repro.with_name(LOG_NAME))
    ready = standby if standby is not None and standby.fits(repro, kernel=kernel, exe=exe) else None
    first = _memcheck(repro, exe, timeout, kernel_options(kernel), where, ready, cancel)
    if not kernel or first.status == "cancelled":
        return first
    if first.status == "found" and first.report.first_access is not None:
        return replace(first, kernel_filter=kernel)
    every = _memcheck(repro, exe, timeout, [], where, cancel=cancel)
    return replace(every, seconds=every.seconds + first.seconds)


@dataclass(frozen=True, slots=True)
class _Where:
    argv: tuple[str, ...]
    cwd: Path
    log: Path


def _memcheck(
    repro: Path,
    exe: str,
    timeout: float,
    options: list[str],
    where: _Where,
    standby: MemcheckStandby | None = None,
    cancel: threading.Event | None = None,
) -> Evidence:
    """One memcheck of `repro`: in `standby` (started ahead with these `options`) or in a
    process started now; the same evidence either way."""
    started = time.perf_counter()
    if standby is not None:
        running = standby.handed(repro, where.argv, where.cwd)
    else:
        running = fresh_memcheck(exe, options, repro, where.argv, where.cwd)
    with contextlib.ExitStack() as stack:
        try:
            run = stack.enter_context(running)
        except OSError as exc:
            return Evidence("failed", f"compute-sanitizer did not start: {exc}")
        evidence = _evidence(run, repro, timeout, where, started, cancel)
    check_log.log("memcheck", standby=run.standby, seconds=round(evidence.seconds, 3),
                  status=evidence.status, kernel_filter=bool(options), script=repro.name)  # fmt: skip
    return evidence


def _evidence(
    run: MemcheckRun,
    repro: Path,
    timeout: float,
    where: _Where,
    started: float,
    cancel: threading.Event | None = None,
) -> Evidence:
    """What `run` reports once it is done (or stopped): its log kept at `where.log`, the
    addresses named by the script's tensors, `started` (perf_counter) to now its seconds."""
    returncode, stopped = wait_for_errors(run.process, run.files.log, timeout, cancel)
    if cancel is not None and cancel.is_set():
        return Evidence("cancelled", "memcheck was stopped: its answer was no longer wanted",
                        seconds=time.perf_counter() - started)  # fmt: skip
    log = run.files.log
    text = log.read_text(errors="replace") if log.exists() else ""
    text = text or run.files.output.read_text(errors="replace")
    saved = where.log
    saved.write_text(text)
    tensors = load_tensor_map(run.files.tensor_map, argument_positions(repro.read_text()))
    seconds = time.perf_counter() - started
    report = parse_report(text)
    if returncode is None and not report.errors:
        return Evidence(
            "timeout", f"memcheck ran past {timeout:.0f} s", report, (), seconds, str(saved)
        )
    findings = findings_of(report, tensors, stopped=stopped)
    if not report.errors:
        return Evidence("clean", "memcheck reported no error", report, (), seconds, str(saved))
    return Evidence("found", "", report, findings, seconds, str(saved), stopped_early=stopped,
                    tensors=tuple(tensors))  # fmt: skip


def wait_for_errors(
    process: subprocess.Popen[Any], log: Path, timeout: float, cancel: threading.Event | None = None
) -> tuple[int | None, bool]:
    """Wait for memcheck, but stop it once its log holds PRINT_LIMIT errors and has gone quiet:
    it prints no more, and counting the rest of a big kernel's errors took 10-33 s of its
    16-41 s on the H200 (1 GB CuPy and Triton repros; the printed ones were in by 6-8 s).
    (exit status or None, stopped early). `cancel`, set: stopped at once."""
    deadline = time.monotonic() + timeout
    size, parsed_at, quiet_since = -1, -1, time.monotonic()
    while True:
        try:
            return process.wait(timeout=0.25), False
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now >= deadline or (cancel is not None and cancel.is_set()):
            return run_with_timeout(process, 0), False
        current = log.stat().st_size if log.exists() else 0
        if current != size:
            size, quiet_since = current, now
        elif size > 0 and size != parsed_at and now - quiet_since >= QUIET_SECONDS:
            parsed_at = size
            if len(parse_report(log.read_text(errors="replace")).errors) >= PRINT_LIMIT:
                run_with_timeout(process, 0)
                return None, True


def wants_evidence(repro: Path, signature: Signature) -> bool:
    """A shrunk repro whose fault is a memory error on the GPU: memcheck can say more."""
    return is_memory_error(signature) and "cuda" in repro.read_text()


def attach(repro: Path, evidence: Evidence) -> None:
    """Found errors go into the repro's docstring."""
    if evidence.status == "found":
        repro.write_text(annotate(repro.read_text(), evidence.header_lines()))


def evidence_for(
    repro: Path, signature: Signature, *, timeout: float = 180.0, kernel: str | None = None
) -> Evidence | None:
    """memcheck on a shrunk repro whose fault is a memory error on the GPU (None otherwise),
    its findings written into the repro's docstring."""
    if not wants_evidence(repro, signature):
        return None
    evidence = run_memcheck(repro, timeout=timeout, kernel=kernel)
    attach(repro, evidence)
    return evidence


def load_tensor_map(path: Path, positions: dict[str, int | str]) -> list[TensorRange]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [TensorRange.from_json(entry, positions) for entry in entries if isinstance(entry, dict)]


def argument_positions(code: str) -> dict[str, int | str]:
    """Names passed to the repro's failing call, by position (or keyword): its last call
    statement that is not a synchronize (a kernel launch `k[grid](x, y)` included)."""
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return {}
    calls: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Expr(self, node: cst.Expr) -> None:
            if isinstance(node.value, cst.Call):
                calls.append(node.value)

    module.visit(_Calls())
    skip = ("synchronize", "manual_seed", "print", "main")
    for candidate in reversed(calls):
        text = module.code_for_node(candidate.func)
        if text.endswith(skip):
            continue
        positions: dict[str, int | str] = {}
        for index, arg in enumerate(candidate.args):
            if isinstance(arg.value, cst.Name):
                key: int | str = arg.keyword.value if arg.keyword else index
                positions.setdefault(arg.value.value, key)
        return positions
    return {}


def annotate(code: str, lines: list[str]) -> str:
    """`code` with `lines` at the end of its docstring (a previous memcheck section replaced)."""
    if not lines:
        return code
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return code
    body = list(module.body)
    text, rest = "", body
    first = body[0] if body else None
    if (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, cst.SimpleString)
    ):
        evaluated = first.body[0].value.evaluated_value
        text = evaluated if isinstance(evaluated, str) else ""
        rest = body[1:]
    text = text.split(HEADER_TITLE)[0].rstrip()
    text = (text + "\n\n" if text else "") + "\n".join(lines)
    quoted = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    docstring = cst.SimpleStatementLine([cst.Expr(cst.SimpleString(f'"""{quoted}\n"""'))])
    if rest and not rest[0].leading_lines:
        rest[0] = rest[0].with_changes(leading_lines=[cst.EmptyLine()])
    header = [line for line in module.header if line.comment is not None]  # no blank first line
    return module.with_changes(header=header, body=[docstring, *rest]).code
