"""What reached the failing call, read by running the script once more in a child.

The recording knows only where a custom kernel was launched, not what it was given. These
probes run the script as `python script.py argv...` would, under a tracer or to the end: one
reads the tensors (their layout included) and plain values at the launch the time it raised
(`probe_launch`), the other the failing traceback (`failing_frames`). They hand the source
reducer its specs and focus line, and `reprocut.localize` the launch's inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as m
import libcst.metadata

from reprocut.check import lifeline
from reprocut.model.case import TensorSpec, spec_from_json
from reprocut.source.passes import focus_callee, parse

# --- what reaches the failing call -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaunchSpecs:
    """The tensors at the failing call, seen just before it ran: its arguments by position
    (None: not a tensor), the tensor parameters of the function making it, and that function's
    plain parameters (numbers, strings, tuples of them) with their values."""

    args: tuple[TensorSpec | None, ...] = ()
    params: tuple[tuple[str, TensorSpec], ...] = ()
    values: tuple[tuple[str, Any], ...] = ()
    kernel: str | None = None  # the launched kernel's own name (`cmvn_vec4`, not `_KERNEL`)


_PROBE = r"""
import json, os, sys, threading
result_path, filename, target_file, first, last, sources, launched = sys.argv[1:8]
sys.argv = [filename, *sys.argv[8:]]
sys.path[0] = os.path.dirname(os.path.abspath(filename))
target_file, sources = os.path.realpath(target_file), json.loads(sources)
first, last = int(first), int(last)
latest = None  # what reached the call the last time it was about to run

def spec(value):
    import torch
    from reprocut.model.case import spec_to_json
    from reprocut.model.tensors import spec_of
    return spec_to_json(spec_of(value)) if isinstance(value, torch.Tensor) else None

def kernel_name(frame):
    try:
        kernel = eval(launched, frame.f_globals, frame.f_locals)
    except Exception:
        return None
    for name in (getattr(kernel, "name", None), getattr(kernel, "__name__", None),
                 getattr(getattr(kernel, "fn", None), "__name__", None)):
        if isinstance(name, str):
            return name  # CuPy RawKernel.name, a function's or Triton JITFunction's name
    return None

def seen(frame):
    found = {"args": [], "params": [], "kernel": kernel_name(frame) if launched else None}
    for source in sources:
        try:
            found["args"].append(spec(eval(source, frame.f_globals, frame.f_locals)))
        except Exception:
            found["args"].append(None)
    found["values"] = []
    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        described = spec(value)
        if described is not None:
            found["params"].append([name, described])
        elif plain(value):
            found["values"].append([name, value])
    return found

def plain(value):
    if isinstance(value, tuple):
        return all(plain(v) for v in value)
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    return value is None or isinstance(value, (bool, int, str))

def report(found):
    if found is not None:
        with open(result_path, "w") as handle:
            json.dump(found, handle)
    os._exit(0)  # nothing is torn down: a faulted CUDA context must not hang the exit

def at_line(frame, event, arg):
    global latest
    if event == "line" and frame.f_lineno == first:
        latest = seen(frame)
    elif event == "exception" and first <= frame.f_lineno <= last:
        report(latest)  # this call raised: these are the tensors that made it fail
    return at_line

mine = {}

def on_call(frame, event, arg):
    name = frame.f_code.co_filename
    hit = mine.get(name)
    if hit is None:
        hit = mine[name] = os.path.realpath(name) == target_file
    return at_line if hit else None

sys.settrace(on_call)
threading.settrace(on_call)
with open(filename) as handle:
    code = compile(handle.read(), filename, "exec")
try:
    exec(code, {"__name__": "__main__", "__file__": filename})
finally:
    report(latest)  # it failed elsewhere (or not at all): the last call is the best guess
"""


def probe_launch(
    script_path: Path,
    *,
    cwd: Path,
    argv: Sequence[str],
    file: Path,
    line: int,
    focus: str,
    timeout: float = 600.0,
) -> LaunchSpecs:
    """Run the script under a line tracer and read the specs of the tensors reaching the failing
    call at `file:line` (`focus`: its text) the time it raised; the last time it ran when it
    never raised there.

    For custom kernels the recording knows only the launch line; this finds what the kernel was
    given (an expand()ed or offset view included), at the step that faulted, not the first.
    Launches are blocking, so an asynchronous fault raises at its call. Empty when the line is
    never reached.
    """
    from reprocut.check.oracle import child_environment

    sources = call_argument_sources(focus)
    span = statement_span(Path(file), line)
    first, last = (line, line) if span is None else span[1:]
    with tempfile.TemporaryDirectory(prefix="reprocut-probe-") as tmp:
        result = Path(tmp) / "specs.json"
        command = [sys.executable, "-c", _PROBE, str(result), str(script_path), str(file),
                   str(first), str(last), json.dumps(sources), launched_source(focus) or "",
                   *argv]  # fmt: skip
        returncode = lifeline.run(
            command,
            cwd=cwd,
            env=child_environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
        if returncode is None:  # timed out
            return LaunchSpecs()
        try:
            found = json.loads(result.read_text())
        except (OSError, ValueError):
            return LaunchSpecs()
    return LaunchSpecs(
        args=tuple(None if s is None else spec_from_json(s) for s in found["args"]),
        params=tuple((name, spec_from_json(s)) for name, s in found["params"]),
        values=tuple((name, _tuples(value)) for name, value in found.get("values", ())),
        kernel=found.get("kernel"),
    )


def _tuples(value: Any) -> Any:
    """JSON wrote the probed tuples as lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def launched_source(focus: str) -> str | None:
    """The object the focus line calls, as code: `add_kernel` for `add_kernel[grid](...)`."""
    callee = focus_callee(focus)
    if callee is None:
        return None
    node = cst.parse_expression(callee)
    while isinstance(node, cst.Subscript):
        node = node.value
    return cst.Module(body=[]).code_for_node(node)


def call_argument_sources(focus: str) -> list[str]:
    """The source text of each positional argument of the focus line's call."""
    try:
        statement = cst.parse_statement(focus.strip() + "\n")
    except cst.ParserSyntaxError:
        return []
    calls = [c for c in m.findall(statement, m.Call()) if isinstance(c, cst.Call)]
    if not calls:
        return []
    module = cst.Module(body=[])
    return [module.code_for_node(a.value) for a in calls[0].args if a.keyword is None]


# --- the failing frames ----------------------------------------------------------------------

_FRAMES = r"""
import json, os, sys, traceback
result_path, filename = sys.argv[1:3]
sys.argv = [filename, *sys.argv[3:]]
sys.path[0] = os.path.dirname(os.path.abspath(filename))
frames = []
try:
    with open(filename) as handle:
        code = compile(handle.read(), filename, "exec")
    exec(code, {"__name__": "__main__", "__file__": filename})
except BaseException as exc:
    frames = [[f.filename, f.lineno] for f in traceback.extract_tb(exc.__traceback__)]
with open(result_path, "w") as handle:
    json.dump(frames, handle)
os._exit(0)
"""


def failing_frames(
    script_path: Path, *, cwd: Path, argv: Sequence[str], timeout: float = 600.0
) -> list[tuple[Path, int]]:
    """The traceback of one fresh run of the script, outermost frame first (empty if it passed)."""
    from reprocut.check.oracle import child_environment

    with tempfile.TemporaryDirectory(prefix="reprocut-frames-") as tmp:
        result = Path(tmp) / "frames.json"
        lifeline.run(
            [sys.executable, "-c", _FRAMES, str(result), str(script_path), *argv],
            cwd=cwd,
            env=child_environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
        try:
            frames = json.loads(result.read_text())
        except (OSError, ValueError):
            return []
    return [(Path(file), line) for file, line in frames]


# --- the failing statement -------------------------------------------------------------------


def statement_span(path: Path, line: int) -> tuple[str, int, int] | None:
    """The whole simple statement that covers `line` (a call spread over lines included): its
    text and its first and last lines."""
    module = parse(path.read_text())
    if module is None:
        return None
    wrapper = cst.metadata.MetadataWrapper(module)
    positions = wrapper.resolve(cst.metadata.PositionProvider)
    for node, span in positions.items():
        if isinstance(node, cst.BaseSmallStatement) and span.start.line <= line <= span.end.line:
            return module.code_for_node(node), span.start.line, span.end.line
    return None


def statement_text(path: Path, line: int) -> str | None:
    """The text of the whole simple statement that covers `line`."""
    found = statement_span(path, line)
    return None if found is None else found[0]
