"""A fork server's child: what runs in it (a request's code as `__main__`), and how the server
keeps track of it (`Running`: its verdict pipe, output files and deadline) until it replies.

A child gets its own process group (killed whole), writes stdout/stderr to files of its own,
sends its verdict up a pipe and leaves with `os._exit` (no destructors: a process after a
sticky CUDA error can hang in teardown). A `Standby` child is forked before its request comes,
its CUDA context made meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprocut.check import lifeline

HEAD_BYTES = 64_000  # kernel assertions come first: keep the head of stderr...
TAIL_BYTES = 16_000  # ...and its tail (the traceback)
MESSAGE_CHARS = 8_000


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """Run the request's code as __main__ in this process; return the child's verdict."""
    from reprocut.check.attribution import FaultAttribution, RaisedError, settle_cuda

    started = time.perf_counter()
    cwd = request.get("cwd") or os.getcwd()
    filename = request.get("filename") or os.path.join(cwd, "repro.py")
    os.chdir(cwd)
    sys.argv = [filename, *request.get("argv", [])]
    sys.path[0] = request.get("sys_path0") or os.path.dirname(os.path.abspath(filename))
    import types

    module = types.ModuleType("__main__")
    module.__file__ = filename
    module.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = module
    verdict: dict[str, Any] = {"status": "passed"}
    attribution = FaultAttribution(sync=bool(request.get("sync", False)))
    try:
        code = compile(request["code"], filename, "exec")
        with attribution:
            exec(code, module.__dict__)
            settle_cuda()  # a candidate ending right after its faulting launch fails too
    except SystemExit as exc:
        if exc.code not in (None, 0):
            verdict = {"status": "raised", "error": _error(RaisedError.from_exception(exc)),
                       "line": module_line(exc, filename)}  # fmt: skip
    except BaseException as exc:
        raised = RaisedError.from_exception(exc, attribution)
        verdict = {
            "status": "raised",
            "error": _error(raised),
            "traceback": traceback.format_exc()[-TAIL_BYTES:],
            "line": module_line(exc, filename),
        }
    verdict["seconds"] = time.perf_counter() - started
    verdict["cuda"] = _cuda_started()
    return verdict


def module_line(exc: BaseException, filename: str) -> int | None:
    """The line the code's own module level was running when `exc` left it (its outermost
    frame): what the code before that statement did, it does again wherever it is the same
    (reprocut.source.failed_prefix)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == filename and code.co_name == "<module>":
            return tb.tb_lineno
        tb = tb.tb_next
    return None


def _cuda_started() -> bool:
    """Did this child start CUDA (its own check, or the standby it ran in)?"""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # a torch half torn down by the candidate: say no
        return False


def _error(raised: Any) -> dict[str, Any]:
    return {
        "type": raised.type,
        "message": raised.message[:MESSAGE_CHARS],
        "error_code": raised.error_code,
        "op": raised.op,
        "public_call": raised.public_call,
    }


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def read_output(path: Path) -> str:
    """Head and tail of a child's output file (kernel assertions can repeat thousands of times)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    if len(data) > HEAD_BYTES + TAIL_BYTES:
        data = data[:HEAD_BYTES] + b"\n[...]\n" + data[-TAIL_BYTES:]
    return data.decode("utf-8", "replace")


def kill_group(pid: int) -> None:
    for sig in (signal.SIGKILL,):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def serve_one(request: dict[str, Any], workdir: Path) -> Running:
    """Fork a child for one request; the loop collects its reply (`Running.poll`)."""
    read_fd, write_fd = os.pipe()
    flush_streams()
    server = os.getpid()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child
        status = 70
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            lifeline.exit_with_parent(server)
            _run_child(request, workdir, write_fd)
            status = 0
        except BaseException:
            _print_exception()
        finally:
            os._exit(status)
    os.close(write_fd)
    return Running.of(pid, read_fd, request, workdir, started)


@dataclass
class Running:
    """A child at work on one request: its verdict pipe, its output folder, its deadline."""

    pid: int
    read_fd: int
    request: dict[str, Any]
    workdir: Path
    started: float
    chunks: list[bytes] = field(default_factory=list)
    cancelled: bool = False

    @classmethod
    def of(
        cls, pid: int, read_fd: int, request: dict[str, Any], workdir: Path, started: float
    ) -> Running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpgid(pid, pid)  # also from this side: no race with a child that is slow to start
        os.set_blocking(read_fd, False)
        return cls(pid, read_fd, request, workdir, started)

    def poll(self) -> dict[str, Any] | None:
        """The reply once the child is done, past its timeout or cancelled; else None."""
        _drain(self.read_fd, self.chunks)
        done, status = os.waitpid(self.pid, os.WNOHANG)
        timeout = float(self.request.get("timeout", 60))
        if not done and time.perf_counter() <= self.started + timeout:
            return None
        kill_group(self.pid)  # on timeout the child itself; else what it left in its group
        if not done:
            os.waitpid(self.pid, 0)
        _drain(self.read_fd, self.chunks)
        os.close(self.read_fd)
        seconds = time.perf_counter() - self.started
        if self.cancelled:
            reply: dict[str, Any] = {"outcome": "cancelled", "seconds": seconds}
        elif not done:
            reply = {"outcome": "timeout", "seconds": seconds}
        else:
            reply = _reply(status, b"".join(self.chunks), seconds)
        reply["stdout"] = read_output(self.workdir / "stdout.txt")
        reply["stderr"] = read_output(self.workdir / "stderr.txt")
        shutil.rmtree(self.workdir, ignore_errors=True)
        if "id" in self.request:
            reply["id"] = self.request["id"]
        return reply

    def cancel(self) -> None:
        self.cancelled = True
        kill_group(self.pid)


def _reply(status: int, data: bytes, seconds: float) -> dict[str, Any]:
    reply: dict[str, Any] = {"seconds": seconds, **_exit_fields(status)}
    text = data.decode("utf-8", "replace")
    if text:
        try:
            reply["verdict"] = json.loads(text)
            reply["outcome"] = "done"
            return reply
        except json.JSONDecodeError:
            pass
    reply["outcome"] = "crashed"
    return reply


def _run_child(request: dict[str, Any], workdir: Path, write_fd: int) -> None:
    """In the forked child: output to files, run the request, send the verdict up the pipe."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, workdir / "stdout.txt"), (2, workdir / "stderr.txt")):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = sys.__stdout__  # the server swapped it for stderr; the child's is fd 1
    import faulthandler

    faulthandler.enable()
    _reseed()
    verdict = run_request(request)
    flush_streams()
    with os.fdopen(write_fd, "w") as pipe:
        pipe.write(json.dumps(verdict))


def _reseed() -> None:
    """A fresh process seeds `random` (and numpy's global generator, when the server preloaded
    numpy) from the OS; forked children would all share the server's state instead."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        with contextlib.suppress(Exception):
            numpy_random.seed()


def _print_exception() -> None:
    try:
        traceback.print_exc()
        flush_streams()
    except BaseException:
        pass


@dataclass
class Standby:
    """A child forked before its request arrives, its CUDA context already made: the request
    then skips the context's start-up (a few tenths of a second on an H200). Asked for with a
    `{"standby": true, "cuda": true}` line, used by the next request."""

    pid: int
    request_fd: int  # the server writes the request here
    result_fd: int  # the child writes its verdict here

    @classmethod
    def fork(cls, cuda: bool) -> Standby:
        request_r, request_w = os.pipe()
        result_r, result_w = os.pipe()
        flush_streams()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(request_w)
            os.close(result_r)
            _standby_child(request_r, result_w, cuda, server)  # never returns
        os.close(request_r)
        os.close(result_w)
        return cls(pid, request_w, result_r)

    def start(self, request: dict[str, Any], workdir: Path) -> Running:
        started = time.perf_counter()
        request = {**request, "workdir": str(workdir)}
        try:
            with os.fdopen(self.request_fd, "w") as pipe:
                pipe.write(json.dumps(request) + "\n")
        except OSError:  # it died while waiting: its exit status says how
            pass
        return Running.of(self.pid, self.result_fd, request, workdir, started)

    def discard(self) -> None:
        """No request came (the server is closing): end the child and its group."""
        with contextlib.suppress(OSError):
            os.close(self.request_fd)
        with contextlib.suppress(OSError):
            os.close(self.result_fd)
        kill_group(self.pid)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _standby_child(request_fd: int, result_fd: int, cuda: bool, server: int) -> None:
    status = 70
    try:
        os.setpgid(0, 0)
        lifeline.exit_with_parent(server)
        if cuda:
            _start_cuda()
        with os.fdopen(request_fd) as pipe:
            line = pipe.readline()
        if line:
            request = json.loads(line)
            _run_child(request, Path(request["workdir"]), result_fd)
        status = 0
    except BaseException:
        _print_exception()
    finally:
        os._exit(status)


def _start_cuda() -> None:
    """Make the CUDA context now; without a usable GPU the request starts it (or fails) as it
    would have anyway."""
    import torch

    with contextlib.suppress(Exception):
        torch.empty(1, device="cuda")


def _exit_fields(status: int) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        return {"returncode": -os.WTERMSIG(status)}
    return {"returncode": os.WEXITSTATUS(status)}


def _drain(fd: int, chunks: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        chunks.append(chunk)
