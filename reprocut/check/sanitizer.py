"""compute-sanitizer evidence for a memory fault: the minimized repro run under memcheck.

An illegal address says only that some kernel touched memory it should not; memcheck says which
kernel, which thread and block, what access of what size and where, and the host backtrace down
to the launch. It costs 20-50x a plain run, so it runs on the shrunk repro only, once, with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 (the caching allocator would hide small overruns inside its own
blocks) and a timeout. A small wrapper runs the repro and writes down where its tensors live
(every CUDA tensor, and anything with `__cuda_array_interface__`, held by the script's frames
before each call they make and when they end), so the address can be named: "reads 4 B at
3.5 GiB before the start of `x` (arg 0)".
Without compute-sanitizer there is a one-line note and nothing fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from reprocut.check.memcheck import (
    MemcheckError,
    MemcheckReport,
    TensorRange,
    describe,
    parse_report,
    useful_frames,
)
from reprocut.check.oracle import run_with_timeout
from reprocut.model.case import Signature
from reprocut.model.signature import is_memory_error

FALLBACK = Path("/usr/local/cuda/bin/compute-sanitizer")
LOG_NAME = "sanitizer.log"
HEADER_TITLE = "compute-sanitizer (memcheck):"
PRINT_LIMIT = 20  # errors memcheck prints (`--print-limit`): the first explains the fault
# bytes of padding memcheck puts after every allocation: a write just past one tensor may land in
# the next allocation, which memcheck takes for valid (on the H200 an extension writing one row
# past its output faulted in plain runs while memcheck reported no error)
PADDING = 1 << 16
QUIET_SECONDS = 0.5  # the log unchanged this long: the errors printed so far are whole
MAP_ENV = "REPROCUT_TENSOR_MAP"

_WRAPPER = r"""
import json, os, runpy, sys
script = os.path.abspath(sys.argv[1])
sys.argv = [script, *sys.argv[2:]]
sys.path[0] = os.path.dirname(script)
target = os.environ.get("REPROCUT_TENSOR_MAP")
seen = {}

def entry(name, value):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return None  # a sparse tensor's parts are tensors of their own
        storage = value.untyped_storage()
        return {"name": name, "data_ptr": value.data_ptr(), "storage_ptr": storage.data_ptr(),
                "storage_bytes": storage.nbytes(), "shape": list(value.shape),
                "dtype": str(value.dtype).replace("torch.", ""), "device": str(value.device)}
    face = getattr(value, "__cuda_array_interface__", None)
    if isinstance(face, dict) and face.get("data"):
        import math
        itemsize = int(face["typestr"][2:])
        size = math.prod(face["shape"]) * itemsize
        return {"name": name, "data_ptr": face["data"][0], "storage_ptr": face["data"][0],
                "storage_bytes": size, "shape": list(face["shape"]), "dtype": face["typestr"]}
    return None

def note(frame):
    changed = False
    for name, value in list(frame.f_locals.items()):
        items = [(name, value)]
        if isinstance(value, (list, tuple)):
            items += [(f"{name}[{i}]", v) for i, v in enumerate(value[:16])]
        for key, item in items:
            try:
                found = entry(key, item)
            except Exception:
                found = None
            if found is not None and found["data_ptr"] not in seen:
                seen[found["data_ptr"]] = found
                changed = True
    if target and changed:
        with open(target, "w") as handle:
            json.dump(list(seen.values()), handle)

def profile(frame, event, arg):
    # before each call out of the script (a library may abort the process inside it, as
    # cuSPARSE's cudaFree of a workspace does after the fault) and when a script frame ends
    if event == "call" and frame.f_back is not None and frame.f_back.f_code.co_filename == script:
        note(frame.f_back)
    elif event in ("c_call", "return") and frame.f_code.co_filename == script:
        note(frame)

sys.setprofile(profile)
runpy.run_path(script, run_name="__main__")
"""


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    return str(FALLBACK) if FALLBACK.is_file() and os.access(FALLBACK, os.X_OK) else None


@dataclass(frozen=True, slots=True)
class Evidence:
    """What memcheck said about the repro (status "found", "clean", "unavailable", "timeout")."""

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
) -> Evidence:
    """Run `python repro` under `compute-sanitizer --tool memcheck`; never raises for its outcome.

    `kernel`: the faulting kernel's name, when known (a custom kernel's). Only kernels whose
    name contains it are instrumented then (`--kernel-name kns=`): the repro's other kernels (a
    1 GB `randn` or two) run at full speed. If that finds no access error (another kernel
    faulted, or the filter is not understood), memcheck runs again over every kernel.
    `argv`, `cwd`: a user's script's arguments and folder; `log`: where memcheck's report is
    kept (default: sanitizer.log beside the repro)."""
    exe = sanitizer or find_sanitizer()
    if exe is None:
        return Evidence(
            "unavailable", "compute-sanitizer is not on PATH: no memory-checker evidence"
        )
    repro = repro.resolve()
    where = _Where(tuple(argv), (cwd or repro.parent).resolve(), log or repro.with_name(LOG_NAME))
    if kernel:
        focused = _memcheck(repro, exe, timeout, ["--kernel-name", f"kns={kernel}"], where)
        if focused.status == "found" and focused.report.first_access is not None:
            return replace(focused, kernel_filter=kernel)
        every = _memcheck(repro, exe, timeout, [], where)
        return replace(every, seconds=every.seconds + focused.seconds)
    return _memcheck(repro, exe, timeout, [], where)


@dataclass(frozen=True, slots=True)
class _Where:
    argv: tuple[str, ...]
    cwd: Path
    log: Path


def _memcheck(repro: Path, exe: str, timeout: float, options: list[str], where: _Where) -> Evidence:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reprocut-sanitizer-") as tmp:
        log, tensor_map, output = (
            Path(tmp) / "memcheck.log",
            Path(tmp) / "tensors.json",
            Path(tmp) / "out",
        )
        command = [exe, "--tool", "memcheck", "--print-limit", str(PRINT_LIMIT), "--padding",
                   str(PADDING), *options, "--log-file",
                   str(log), sys.executable, "-c", _WRAPPER, str(repro), *where.argv]  # fmt: skip
        env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
               MAP_ENV: str(tensor_map)}  # fmt: skip
        with output.open("w") as sink:
            try:
                process = subprocess.Popen(command, cwd=where.cwd, env=env, stdin=subprocess.DEVNULL,
                                           stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            except OSError as exc:
                return Evidence("failed", f"compute-sanitizer did not start: {exc}")
            returncode, stopped = wait_for_errors(process, log, timeout)
        text = log.read_text(errors="replace") if log.exists() else ""
        text = text or output.read_text(errors="replace")
        saved = where.log
        saved.write_text(text)
        tensors = load_tensor_map(tensor_map, argument_positions(repro.read_text()))
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
    process: subprocess.Popen[Any], log: Path, timeout: float
) -> tuple[int | None, bool]:
    """Wait for memcheck, but stop it once its log holds PRINT_LIMIT errors and has gone quiet:
    it prints no more, and counting the rest of a big kernel's errors took 10-33 s of its
    16-41 s on the H200 (1 GB CuPy and Triton repros; the printed ones were in by 6-8 s).
    (exit status or None, stopped early)."""
    deadline = time.monotonic() + timeout
    size, parsed_at, quiet_since = -1, -1, time.monotonic()
    while True:
        try:
            return process.wait(timeout=0.25), False
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now >= deadline:
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
