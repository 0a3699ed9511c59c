"""One compute-sanitizer memcheck process over a script: started for a script given now, or started
ahead to wait for one (`MemcheckStandby`). reprocut.check.sanitizer reads what it reports.

The process runs `python -c WRAPPER`: a small wrapper that writes down where the script's tensors
live (every CUDA tensor, and anything with `__cuda_array_interface__`, held by the script's frames
before each call they make and when they end) and runs the script as `__main__`, so that
memcheck's address can be named ("reads 4 B at 3.5 GiB before the start of `x` (arg 0)").

Why ahead: on the H200 a repro's memcheck took ~5.5 s alone, most of it python importing torch
(and CuPy, Triton) under the sanitizer before the repro reached its kernel, and with four shrinks
at once it ended 0.7-2.1 s after the verification's plain runs. A standby imports torch under the
sanitizer while the shrink runs, then reads the repro to run from stdin. Only a repro whose first
statement is `import torch` (reprocut.check.plainrun.starts_by_importing_torch) is run so: for it
the import done ahead changes nothing it sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprocut.check import lifeline
from reprocut.check.plainrun import STANDBY_REQUEST, starts_by_importing_torch

PRINT_LIMIT = 20  # errors memcheck prints (`--print-limit`): the first explains the fault
# bytes of padding memcheck puts after every allocation: a write just past one tensor may land in
# the next allocation, which memcheck takes for valid (on the H200 an extension writing one row
# past its output faulted in plain runs while memcheck reported no error)
PADDING = 1 << 16
MAP_ENV = "REPROCUT_TENSOR_MAP"

# the script's path, its arguments and sys.path[0] as `python script args...` has them
_FROM_ARGV = r"""
import json, os, runpy, sys
script = os.path.abspath(sys.argv[1])
sys.argv = [script, *sys.argv[2:]]
sys.path[0] = os.path.dirname(script)
"""

# the same, read from stdin once torch is imported, as the plain runs' interpreters do (the
# script is handed over by its absolute path: sys.argv[0] is that path, as above)
_FROM_STDIN = "import runpy\n" + STANDBY_REQUEST

# the tensor map and the run, for a `script` set up as above
_MAPPED_RUN = r"""
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

# before each call the script makes (a library may abort the process inside it, as cuSPARSE's
# cudaFree of a workspace does after the fault) and when a script frame ends
monitoring = getattr(sys, "monitoring", None)
tool = None
if monitoring is not None:
    tool = next((i for i in range(6) if monitoring.get_tool(i) is None), None)
if tool is not None:
    # only the script's own code is watched: a profile function called for every call of every
    # module (torch's import: millions) made the repro's memcheck seconds slower
    events = monitoring.events

    def started(code, offset):
        if code.co_filename == script:
            monitoring.set_local_events(tool, code, events.CALL | events.PY_RETURN)
        return monitoring.DISABLE

    def calls(code, offset, callee, arg):
        note(sys._getframe(1))

    def returns(code, offset, value):
        note(sys._getframe(1))

    monitoring.use_tool_id(tool, "reprocut tensor map")
    monitoring.register_callback(tool, events.PY_START, started)
    monitoring.register_callback(tool, events.CALL, calls)
    monitoring.register_callback(tool, events.PY_RETURN, returns)
    monitoring.set_events(tool, events.PY_START)
else:  # before Python 3.12

    def profile(frame, event, arg):
        if event == "call" and frame.f_back is not None and frame.f_back.f_code.co_filename == script:
            note(frame.f_back)
        elif event in ("c_call", "return") and frame.f_code.co_filename == script:
            note(frame)

    sys.setprofile(profile)
runpy.run_path(script, run_name="__main__")
"""

WRAPPER = _FROM_ARGV + _MAPPED_RUN  # python -c WRAPPER script args...
STANDBY_WRAPPER = _FROM_STDIN + _MAPPED_RUN  # python -c STANDBY_WRAPPER, the script on stdin


def kernel_options(kernel: str | None) -> list[str]:
    """memcheck's options to instrument only kernels named like `kernel` (none: every kernel)."""
    return ["--kernel-name", f"kns={kernel}"] if kernel else []


@dataclass(frozen=True, slots=True)
class MemcheckFiles:
    """What one memcheck process writes, in a folder of its own."""

    folder: Path

    @property
    def log(self) -> Path:  # memcheck's report (`--log-file`)
        return self.folder / "memcheck.log"

    @property
    def tensor_map(self) -> Path:  # the wrapper's map of the script's tensors
        return self.folder / "tensors.json"

    @property
    def output(self) -> Path:  # the process's stdout and stderr
        return self.folder / "out"


@dataclass(frozen=True, slots=True)
class MemcheckRun:
    """A memcheck process running a script, and its files (`standby`: started ahead)."""

    process: subprocess.Popen[Any]
    files: MemcheckFiles
    standby: bool = False


def _start(
    exe: str, options: Sequence[str], program: Sequence[str], files: MemcheckFiles, *,
    cwd: Path, stdin: int,
) -> subprocess.Popen[Any]:  # fmt: skip
    """`exe --tool memcheck ... python program...` in a process group of its own, owned by
    reprocut (lifeline: it dies with reprocut) until `_end`."""
    command = [exe, "--tool", "memcheck", "--print-limit", str(PRINT_LIMIT), "--padding",
               str(PADDING), *options, "--log-file", str(files.log), sys.executable, *program]  # fmt: skip
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", MAP_ENV: str(files.tensor_map)}
    with files.output.open("w") as sink:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdin=stdin, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    lifeline.own(process.pid)
    return process


def _end(process: subprocess.Popen[Any]) -> None:
    """Kill what is left of the process's group (all of it, if it still runs), reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    lifeline.disown(process.pid)


@contextlib.contextmanager
def fresh_memcheck(
    exe: str, options: Sequence[str], script: Path, argv: Sequence[str], cwd: Path
) -> Iterator[MemcheckRun]:
    """memcheck started now on `python script argv...` from `cwd` (OSError: it did not start);
    ended, its files removed, when the block ends."""
    with tempfile.TemporaryDirectory(prefix="reprocut-sanitizer-") as tmp:
        files = MemcheckFiles(Path(tmp))
        program = ["-c", WRAPPER, str(script), *argv]
        process = _start(exe, options, program, files, cwd=cwd, stdin=subprocess.DEVNULL)
        try:
            yield MemcheckRun(process, files)
        finally:
            _end(process)


class MemcheckStandby:
    """One memcheck process started ahead: python under the sanitizer imports torch, then waits
    for one script to run on stdin. Used once (`handed`) or ended unused (`close`); never
    handed anything, it reads EOF when reprocut ends and exits."""

    def __init__(self, exe: str, *, kernel: str | None, cwd: Path) -> None:
        """`kernel`: the only kernels to instrument (None: every kernel); `cwd`: the folder of
        the script it will run (where `import torch` looks first, as `python script` does).
        OSError: it did not start."""
        self.exe, self.kernel = exe, kernel
        self._tmp = tempfile.TemporaryDirectory(prefix="reprocut-sanitizer-")
        self.files = MemcheckFiles(Path(self._tmp.name))
        self._lock = threading.Lock()
        self._used = False
        try:
            self.process = _start(exe, kernel_options(kernel), ["-c", STANDBY_WRAPPER],
                                  self.files, cwd=cwd, stdin=subprocess.PIPE)  # fmt: skip
        except OSError:
            self._tmp.cleanup()
            raise

    @classmethod
    def start(cls, exe: str, *, kernel: str | None, cwd: Path) -> MemcheckStandby | None:
        """A standby, or None if it did not start (memcheck then runs fresh, as without one)."""
        try:
            return cls(exe, kernel=kernel, cwd=cwd)
        except OSError:
            return None

    def fits(self, script: Path, *, kernel: str | None, exe: str | None = None) -> bool:
        """Would running `script` here be the fresh memcheck's run? Not used yet, still
        waiting, the same kernel filter (and sanitizer), and the script's first statement is
        `import torch`."""
        if self._used or self.process.poll() is not None or self.kernel != kernel:
            return False
        if exe is not None and exe != self.exe:
            return False
        try:
            return starts_by_importing_torch(script.read_text())
        except OSError:
            return False

    @contextlib.contextmanager
    def handed(self, script: Path, argv: Sequence[str], cwd: Path) -> Iterator[MemcheckRun]:
        """Run `script` with `argv` from `cwd`, as `python script argv...` would; the standby is
        ended (its files removed) when the block ends. Once only."""
        with self._lock:
            if self._used:
                raise RuntimeError("a memcheck standby runs one script only")
            self._used = True
        request = {"filename": str(script), "argv": list(argv), "cwd": str(cwd)}
        try:
            assert self.process.stdin is not None
            with contextlib.suppress(BrokenPipeError, OSError):  # it died: its log says why
                self.process.stdin.write((json.dumps(request) + "\n").encode())
                self.process.stdin.close()  # the script reads EOF, as from /dev/null
            yield MemcheckRun(self.process, self.files, standby=True)
        finally:
            self._close()

    def close(self) -> None:
        """End it unless it was handed a script (`handed` ends that one itself)."""
        with self._lock:
            if self._used:
                return
            self._used = True
        self._close()

    def _close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        _end(self.process)
        self._tmp.cleanup()
