"""`python -m reprocut.check.forkserver`: pay `import torch` once, run each candidate in a forked child.

The server sets the NVML-based CUDA check *before* importing torch, imports torch and never
touches `torch.cuda` (that would poison fork for the children). Its children run as a plain
`python repro.py` would: no CUDA_LAUNCH_BLOCKING unless the oracle's environment (or the
candidate itself, before it initialises CUDA) sets it, and no synchronization after each op
unless the request asks for it (`sync`: localization does; checks of candidates do not). For each
JSON-line request on stdin ({code, filename, cwd, argv, sys_path0, timeout}) it forks a child
that gets its own process group, writes stdout/stderr to files, runs the code as `__main__` under
FaultAttribution, sends its verdict through a pipe and leaves with `os._exit` (no destructors: a
process after a sticky CUDA error can hang in teardown). The server kills the child's group on
timeout and answers one JSON line. `--once REQUEST` runs one request in this very process (the
fresh-process mode of the oracle). With `--parent PID`, the server and its children end once that
process (reprocut) is gone, even if it was SIGKILLed (see lifeline).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprocut import silence_torch_import_warnings
from reprocut.check import lifeline

FORK_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # torch.cuda.is_available() without CUDA
BLOCKING_ENV = {"CUDA_LAUNCH_BLOCKING": "1", **FORK_ENV}
HEAD_BYTES = 64_000  # kernel assertions come first: keep the head of stderr...
TAIL_BYTES = 16_000  # ...and its tail (the traceback)
MESSAGE_CHARS = 8_000
POLL_SECONDS = 0.002
_parent: int | None = None  # reprocut's pid (--parent): once it is gone, the server ends


def _set_environment() -> None:
    os.environ.update(FORK_ENV)


def _preload() -> None:
    """What every child needs, imported once in the server (none of it touches CUDA)."""
    import torch
    import torch.nn.functional

    from reprocut.check import attribution
    from reprocut.model.publicapi import _public_index

    _public_index()  # build the public-name index once, before forking
    # the first op under the modes warms their code paths once (torch._dynamo stays unimported)
    if os.environ.get("REPROCUT_FORKSERVER_WARMUP", "1") != "0":
        with attribution.FaultAttribution():
            torch.nn.functional.embedding(torch.tensor([0]), torch.zeros(1, 1)).sum().item()


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
            verdict = {"status": "raised", "error": _error(RaisedError.from_exception(exc))}
    except BaseException as exc:
        raised = RaisedError.from_exception(exc, attribution)
        verdict = {
            "status": "raised",
            "error": _error(raised),
            "traceback": traceback.format_exc()[-TAIL_BYTES:],
        }
    verdict["seconds"] = time.perf_counter() - started
    return verdict


def _error(raised: Any) -> dict[str, Any]:
    return {
        "type": raised.type,
        "message": raised.message[:MESSAGE_CHARS],
        "error_code": raised.error_code,
        "op": raised.op,
        "public_call": raised.public_call,
    }


def _flush() -> None:
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


def _kill_group(pid: int) -> None:
    for sig in (signal.SIGKILL,):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def serve_one(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Fork a child for one request, wait with the timeout, and collect what it left."""
    read_fd, write_fd = os.pipe()
    _flush()
    started = time.perf_counter()
    server = os.getpid()
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
    return _collect(pid, read_fd, request, workdir, started)


def _collect(
    pid: int, read_fd: int, request: dict[str, Any], workdir: Path, started: float
) -> dict[str, Any]:
    """The server's side of a request: wait for the child with the timeout, read its output."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpgid(pid, pid)  # also from this side: no race with a child that is slow to start
    reply = _wait(pid, read_fd, float(request.get("timeout", 60)), started)
    reply["stdout"] = read_output(workdir / "stdout.txt")
    reply["stderr"] = read_output(workdir / "stderr.txt")
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
    verdict = run_request(request)
    _flush()
    with os.fdopen(write_fd, "w") as pipe:
        pipe.write(json.dumps(verdict))


def _print_exception() -> None:
    try:
        traceback.print_exc()
        _flush()
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
        _flush()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(request_w)
            os.close(result_r)
            _standby_child(request_r, result_w, cuda, server)  # never returns
        os.close(request_r)
        os.close(result_w)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpgid(pid, pid)
        return cls(pid, request_w, result_r)

    def serve(self, request: dict[str, Any], workdir: Path) -> dict[str, Any]:
        started = time.perf_counter()
        request = {**request, "workdir": str(workdir)}
        try:
            with os.fdopen(self.request_fd, "w") as pipe:
                pipe.write(json.dumps(request) + "\n")
        except OSError:  # it died while waiting: its exit status says how
            pass
        return _collect(self.pid, self.result_fd, request, workdir, started)

    def discard(self) -> None:
        """No request came (the server is closing): end the child and its group."""
        with contextlib.suppress(OSError):
            os.close(self.request_fd)
        with contextlib.suppress(OSError):
            os.close(self.result_fd)
        _kill_group(self.pid)
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


def _wait(pid: int, read_fd: int, timeout: float, started: float) -> dict[str, Any]:
    chunks: list[bytes] = []
    os.set_blocking(read_fd, False)
    deadline = started + timeout
    status: int | None = None
    while status is None:
        _drain(read_fd, chunks)
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = raw
            break
        if _parent is not None and os.getppid() != _parent:  # reprocut is gone: so are we
            _kill_group(pid)
            os._exit(1)
        if time.perf_counter() > deadline:
            _kill_group(pid)
            os.waitpid(pid, 0)
            _drain(read_fd, chunks)
            os.close(read_fd)
            return {"outcome": "timeout", "seconds": time.perf_counter() - started}
        time.sleep(POLL_SECONDS)
    _kill_group(pid)  # anything the child left behind in its group
    _drain(read_fd, chunks)
    os.close(read_fd)
    seconds = time.perf_counter() - started
    text = b"".join(chunks).decode("utf-8", "replace")
    reply: dict[str, Any] = {"seconds": seconds, **_exit_fields(status)}
    if text:
        try:
            reply["verdict"] = json.loads(text)
            reply["outcome"] = "done"
            return reply
        except json.JSONDecodeError:
            pass
    reply["outcome"] = "crashed"
    return reply


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


def serve(stdin: Any, stdout: Any) -> None:
    """The request loop: one JSON line in, one JSON line out, until stdin closes."""
    _preload()
    import torch

    ready = {
        "ready": True,
        "pid": os.getpid(),
        "torch": torch.__version__,
        # a parent with CUDA initialised would poison every forked child: the oracle checks this
        "cuda_initialized": bool(torch.cuda.is_initialized()),
    }
    stdout.write(json.dumps(ready) + "\n")
    stdout.flush()
    standby: Standby | None = None
    with tempfile.TemporaryDirectory(prefix="reprocut-fork-") as tmp:
        workdir = Path(tmp)
        try:
            for line in stdin:
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                    if request.get("standby"):
                        standby = standby or Standby.fork(cuda=bool(request.get("cuda")))
                        reply = {"outcome": "standby", "pid": standby.pid}
                    elif standby is not None and not request.get("fresh_child"):
                        standby, used = None, standby
                        reply = used.serve(request, workdir)
                    else:  # a candidate that sets the environment CUDA reads must start it
                        if standby is not None:
                            standby.discard()
                            standby = None
                        reply = serve_one(request, workdir)
                except Exception as exc:  # a broken request must not take the server down
                    reply = {"outcome": "error", "message": repr(exc)}
                stdout.write(json.dumps(reply) + "\n")
                stdout.flush()
        finally:
            if standby is not None:
                standby.discard()


def run_once(request_path: Path, verdict_path: Path) -> None:
    """Fresh-process mode: this process is the child; the oracle owns the timeout and the files."""
    import faulthandler

    faulthandler.enable()
    request = json.loads(request_path.read_text())
    verdict = run_request(request)
    _flush()
    tmp = verdict_path.with_name(verdict_path.name + ".tmp")
    tmp.write_text(json.dumps(verdict))
    os.replace(tmp, verdict_path)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m reprocut.check.forkserver")
    parser.add_argument("--once", type=Path, help="run one request (JSON file) in this process")
    parser.add_argument("--verdict", type=Path, help="with --once: where to write the verdict")
    parser.add_argument("--parent", type=int, help="end when this process is gone")
    options = parser.parse_args(argv)
    _set_environment()
    silence_torch_import_warnings()
    global _parent
    _parent = options.parent
    if options.once:
        lifeline.end_group_with_parent(options.parent)
        if options.verdict is None:
            parser.error("--once needs --verdict")
        run_once(options.once, options.verdict)
        return
    # the server's own stdout carries replies only: anything else printed goes to stderr
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
