"""What reached the failing call, read by running the script once more in a child.

The recording knows only where a custom kernel was launched, not what it was given. These
probes run the script as `python script.py argv...` would, under a tracer or to the end: one
reads the tensors (their layout included), the range of integer tensors' values and the plain
values at the launch the time it raised (`probe_launch`, kept for `shrink` by `kept_launch`),
the other the failing traceback (`failing_frames`). What they read is
`reprocut.source.launch_specs`; the focus line is taken apart by `reprocut.source.focus`. They
hand the source reducer its specs and focus line, and `reprocut.localize` the launch's inputs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reprocut.check import lifeline
from reprocut.source.focus import (
    call_argument_sources,
    call_keyword_sources,
    launch_grid_source,
    launched_source,
    statement_span,
    statement_text,
)
from reprocut.source.launch_specs import LaunchSpecs, launch_specs_from_json

# --- what reaches the failing call -----------------------------------------------------------

_PROBE = r"""
import json, operator, os, sys, threading
result_path, filename, target_file, first, last, sources, launched, extra = sys.argv[1:9]
sys.argv = [filename, *sys.argv[9:]]
sys.path[0] = os.path.dirname(os.path.abspath(filename))
target_file, sources, extra = os.path.realpath(target_file), json.loads(sources), json.loads(extra)
first, last = int(first), int(last)
latest = None  # what reached the call the last time it was about to run

def spec(value):
    import torch
    from reprocut.model.case import spec_to_json
    from reprocut.model.tensors import spec_of
    return spec_to_json(spec_of(value)) if isinstance(value, torch.Tensor) else None

def kernel_name(kernel):
    for name in (getattr(kernel, "name", None), getattr(kernel, "__name__", None),
                 getattr(getattr(kernel, "fn", None), "__name__", None)):
        if isinstance(name, str):
            return name  # CuPy RawKernel.name, a function's or Triton JITFunction's name
    return None

MISSING = object()

def value_of(source, frame):
    try:
        return eval(source, frame.f_globals, frame.f_locals)
    except Exception:
        return MISSING

def scalar(value):  # a plain launch value: an int (numpy's too), a float, a tuple of them
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (list, tuple)):
        return [scalar(v) for v in value[:16]]
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if type(value).__module__.startswith("numpy"):
        try:
            return operator.index(value)
        except TypeError:
            return None
    return value if isinstance(value, int) else None

def integers(value):  # smallest and largest value, read while the device is still healthy
    import torch
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or not value.numel():
        return None
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        return None
    try:
        flat = value.detach().reshape(-1).to(torch.int64)
        return {"low": int(flat.min()), "high": int(flat.max()), "low_at": int(flat.argmin()),
                "high_at": int(flat.argmax()), "shape": list(value.shape)}
    except Exception:
        return None

def seen(frame):
    kernel = value_of(launched, frame) if launched else MISSING
    found = {"args": [], "params": [], "integers": [],
             "kernel": None if kernel is MISSING else kernel_name(kernel)}
    library = None if kernel is MISSING else type(kernel).__module__.split(".")[0]
    launch = {"args": [], "keywords": [], "grid": None, "library": library}
    for source in sources:
        value = value_of(source, frame)
        value = None if value is MISSING else value
        found["args"].append(spec(value))
        launch["args"].append(scalar(value))
        counted = integers(value)
        if counted is not None:
            found["integers"].append([source, counted])
    for name, source in extra["keywords"]:
        value = value_of(source, frame)
        launch["keywords"].append([name, None if value is MISSING else scalar(value)])
    if extra["grid"]:
        grid = value_of(extra["grid"], frame)
        launch["grid"] = None if grid is MISSING or callable(grid) else scalar(grid)
    found["launch"], found["values"] = launch, []
    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        described = spec(value)
        if described is not None:
            found["params"].append([name, described])
            counted = integers(value)
            if counted is not None:
                found["integers"].append([name, counted])
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
    keep: Path | None = None,
) -> LaunchSpecs:
    """Run the script under a line tracer and read the specs of the tensors reaching the failing
    call at `file:line` (`focus`: its text) the time it raised; the last time it ran when it
    never raised there.

    For custom kernels the recording knows only the launch line; this finds what the kernel was
    given (an expand()ed or offset view included), at the step that faulted, not the first.
    Launches are blocking, so an asynchronous fault raises at its call. Empty when the line is
    never reached. `keep`: where to write what was read, for `kept_launch` (a run of the whole
    script is what this costs, and `shrink` needs the same reading).
    """
    from reprocut.check.childenv import child_environment

    sources = call_argument_sources(focus)
    span = statement_span(Path(file), line)
    first, last = (line, line) if span is None else span[1:]
    with tempfile.TemporaryDirectory(prefix="reprocut-probe-") as tmp:
        result = Path(tmp) / "specs.json"
        extra = {"keywords": call_keyword_sources(focus), "grid": launch_grid_source(focus)}
        command = [sys.executable, "-c", _PROBE, str(result), str(script_path), str(file),
                   str(first), str(last), json.dumps(sources), launched_source(focus) or "",
                   json.dumps(extra), *argv]  # fmt: skip
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
    if keep is not None:
        kept = {"script": str(Path(script_path).resolve()), "argv": list(argv),
                "file": str(Path(file).resolve()), "line": line, "focus": focus, "found": found}  # fmt: skip
        with contextlib.suppress(OSError):  # a cache: shrink probes again without it
            keep.write_text(json.dumps(kept))
    return launch_specs_from_json(found)


@dataclass(frozen=True, slots=True)
class KeptLaunch:
    """A launch probe written at record time: the failing call and what reached it."""

    file: Path
    line: int
    focus: str
    specs: LaunchSpecs


def kept_launch(path: Path, script_path: Path, argv: Sequence[str]) -> KeptLaunch | None:
    """The probe `probe_launch(keep=path)` wrote, if it is for this script and argv and its
    file still has the focus at that line; else None (probe again)."""
    try:
        kept = json.loads(Path(path).read_text())
        file, line, focus = Path(kept["file"]), int(kept["line"]), kept["focus"]
        if kept["script"] != str(Path(script_path).resolve()) or kept["argv"] != list(argv):
            return None
        if statement_text(file, line) != focus:
            return None  # the script changed since it was recorded
        return KeptLaunch(file, line, focus, launch_specs_from_json(kept["found"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
    from reprocut.check.childenv import child_environment

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
