"""What reached the failing call, read by running the script once more in a child.

The recording's blocking rerun reads what reached a custom kernel's launch as it names the
launch line (reprocut.record.inside.launch_read, whose reader the probe shares); when that
reading is missing (or the script changed since), these probes run the script as
`python script.py argv...` would, under a tracer or to the end: one reads the tensors (their
layout included), the range of integer tensors' values, the plain values and the pointers at
the launch the time it raised (`probe_launch`, kept for `shrink` by `kept_launch`),
the other the failing traceback (`failing_frames`). What they read is
`reprocut.source.launch_specs`; the focus line is taken apart by `reprocut.source.focus`. They
hand the source reducer its specs and focus line, and `reprocut.localize` the launch's inputs.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprocut.check import lifeline
from reprocut.record.inside.launch_read import LaunchCall
from reprocut.source.focus import statement_span, statement_text
from reprocut.source.launch_specs import LaunchSpecs, launch_specs_from_json

# --- what reaches the failing call -----------------------------------------------------------

_PROBE = r"""
import json, os, sys, threading
result_path, filename, targets = sys.argv[1:4]
sys.argv = [filename, *sys.argv[4:]]
sys.path[0] = os.path.dirname(os.path.abspath(filename))
from reprocut.record.inside.launch_read import (
    LaunchCall, evaluate_any, integer_range, read_frame)
targets = json.loads(targets)
at, spans = {}, {}  # (file, first line) -> (target, its call); file -> [(first, last)]
for index, (target_file, first, last, call) in enumerate(targets):
    target_file = os.path.realpath(target_file)
    at.setdefault((target_file, first), (index, LaunchCall.from_json(call)))
    spans.setdefault(target_file, []).append((first, last))
latest = [None] * len(targets)  # what reached each call the last time it was about to run

def report():
    if any(found is not None for found in latest):
        with open(result_path, "w") as handle:
            json.dump(latest, handle)
    os._exit(0)  # nothing is torn down: a faulted CUDA context must not hang the exit

mine = {}  # a code object's file name -> its real path when it is a target's, else None

def at_line(frame, event, arg):
    name = mine[frame.f_code.co_filename]
    if event == "line":
        hit = at.get((name, frame.f_lineno))
        if hit is not None:
            latest[hit[0]] = read_frame(
                frame, hit[1], evaluate=evaluate_any, integers=integer_range)
    elif event == "exception" and any(a <= frame.f_lineno <= b for a, b in spans[name]):
        report()  # this call raised: these are the tensors that made it fail
    return at_line

def on_call(frame, event, arg):
    name = frame.f_code.co_filename
    if name not in mine:
        real = os.path.realpath(name)
        mine[name] = real if real in spans else None
    return at_line if mine[name] is not None else None

sys.settrace(on_call)
threading.settrace(on_call)
with open(filename) as handle:
    code = compile(handle.read(), filename, "exec")
try:
    exec(code, {"__name__": "__main__", "__file__": filename})
finally:
    report()  # it failed elsewhere (or not at all): the last calls are the best guess
"""

Target = tuple[Path, int, str]  # a frame of the failing stack: file, line, focus text


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
    (found,) = _probe(script_path, cwd, argv, [(file, line, focus)], timeout)
    if keep is not None and found is not None:
        kept = {"script": str(Path(script_path).resolve()), "argv": list(argv),
                "file": str(Path(file).resolve()), "line": line, "focus": focus, "found": found,
                "read_by": "probe"}  # fmt: skip
        with contextlib.suppress(OSError):  # a cache: shrink probes again without it
            keep.write_text(json.dumps(kept))
    return LaunchSpecs() if found is None else launch_specs_from_json(found)


def probe_launches(
    script_path: Path,
    *,
    cwd: Path,
    argv: Sequence[str],
    targets: Sequence[Target],
    timeout: float = 600.0,
) -> list[LaunchSpecs]:
    """`probe_launch` for several frames of the failing stack in one run (the innermost's call
    raises; what reached the outer frames' calls was read as each was about to run): one
    LaunchSpecs per target, empty for a line never reached."""
    return [
        LaunchSpecs() if found is None else launch_specs_from_json(found)
        for found in _probe(script_path, cwd, argv, targets, timeout)
    ]


def _probe(
    script_path: Path, cwd: Path, argv: Sequence[str], targets: Sequence[Target], timeout: float
) -> list[dict[str, Any] | None]:
    """The probe's JSON for each target (None: not read)."""
    from reprocut.check.childenv import child_environment

    described = []
    for file, line, focus in targets:
        span = statement_span(Path(file), line)
        first, last = (line, line) if span is None else span[1:]
        described.append([str(file), first, last, LaunchCall.from_focus(focus).to_json()])
    with tempfile.TemporaryDirectory(prefix="reprocut-probe-") as tmp:
        result = Path(tmp) / "specs.json"
        command = [sys.executable, "-c", _PROBE, str(result), str(script_path),
                   json.dumps(described), *argv]  # fmt: skip
        returncode = lifeline.run(
            command,
            cwd=cwd,
            env=child_environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
        try:
            found = json.loads(result.read_text()) if returncode is not None else None
        except (OSError, ValueError):
            found = None
    if not isinstance(found, list) or len(found) != len(targets):
        return [None] * len(targets)
    return found


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

_TRACEBACK_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in .+$')


def traceback_frames(text: str) -> list[tuple[Path, int]]:
    """The frames of the last traceback in `text` (as Python prints it), outermost first,
    each kept only while the line it names still holds the text the traceback shows (a
    script edited since it was recorded is run again instead: `failing_frames`)."""
    frames: list[tuple[Path, int]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            frames = []
        match = _TRACEBACK_FRAME.match(line)
        if match is None:
            continue
        file, number = Path(match["file"]), int(match["line"])
        if not file.is_file():  # `<string>`, a frozen module: no line of the user's
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        shown = following.strip() if following.startswith("    ") else ""
        if shown and _line(file, number) != shown:
            return []  # the file changed since it failed: read the frames again
        frames.append((file, number))
    return frames


def _line(file: Path, number: int) -> str:
    try:
        lines = file.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""


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
