"""Does this candidate still fail the same way? Each check runs in a disposable process.

A child's failure is data, not an exception: every check returns one Verdict. By default the
checks go to a fork server (`reprocut.check.forkserver`) that has torch imported already; `fork=False`
runs each check in a fresh `python` instead (slower, but no shared parent at all).

A check runs the candidate the way the user's `python repro.py` will: no CUDA_LAUNCH_BLOCKING and
no synchronization after each op (`launch_blocking=True` is for localization, where a fault must
raise at the op that launched it). An asynchronous CUDA error then surfaces where it would in a
plain run, so its op is not compared. What a forked child cannot show (state inherited from the
server) a `confirm` hook may settle with a plain run (`reprocut.check.agreement`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprocut import PACKAGE_DIR
from reprocut.check import lifeline
from reprocut.check.forkserver import BLOCKING_ENV, FORK_ENV, read_output
from reprocut.model.case import ReproCase, Signature
from reprocut.model.signature import CRASH, classify, crash_signature
from reprocut.shrink.emitter import SIDECAR_NAME, emit, inline_captured
from reprocut.shrink.header import Header

STDERR_TAIL = 4000
SERVER_GRACE = 30.0  # seconds the server may take beyond a check's own timeout before we give up
STARTUP_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class Reproduced:
    """Failed with the expected signature."""

    signature: Signature
    message: str
    stderr: str
    seconds: float


@dataclass(frozen=True, slots=True)
class OtherFailure:
    """Failed, but not the same way (another exception, op or assertion)."""

    signature: Signature
    message: str
    stderr: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Passed:
    seconds: float
    stdout: str = ""


@dataclass(frozen=True, slots=True)
class TimedOut:
    seconds: float


@dataclass(frozen=True, slots=True)
class Crashed:
    """The process died without a verdict (abort, segfault, os._exit)."""

    returncode: int | None
    stderr: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ForkOnly:
    """Reproduced in the fork server's child but not in a plain run of the same code: the two
    kinds of process disagree, so the candidate does not count as reproducing."""

    signature: Signature
    plain: Signature | None  # what the plain run failed with (None: it passed)
    stderr: str
    seconds: float


Verdict = Reproduced | OtherFailure | Passed | TimedOut | Crashed | ForkOnly
# confirm(code, filename, cwd, argv, verdict, expected) -> the verdict to return
Confirm = Callable[[str, str, str, list[str], "Verdict", "Signature | None"], "Verdict"]


class ForkUnsafeError(RuntimeError):
    """The server's parent has CUDA initialised: forked children would inherit a broken context."""


def _package_root() -> str:
    return os.path.dirname(PACKAGE_DIR)


def child_environment(*, blocking: bool = True) -> dict[str, str]:
    """The environment of reprocut's child processes, reprocut importable; with `blocking`
    (probes and localization), blocking launches, else the user's own environment as it is."""
    env = dict(os.environ)
    env.update(BLOCKING_ENV if blocking else FORK_ENV)
    root = _package_root()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def verdict_from_reply(
    reply: Mapping[str, Any],
    expected: Signature | None,
    *,
    compare_op: bool = True,
    synchronized: bool = True,
) -> Verdict:
    """Turn a server (or fresh-process) reply into a Verdict, comparing with `expected`.
    Unsynchronized, a CUDA error raises wherever the GPU is next waited for: its op is not
    compared (as plain verification compares none)."""
    seconds = float(reply.get("seconds", 0.0))
    stderr = str(reply.get("stderr", ""))
    outcome = reply.get("outcome")
    if outcome == "timeout":
        return TimedOut(seconds)
    if outcome != "done":
        returncode = reply.get("returncode")
        if expected is not None and expected.error_type == CRASH and returncode is not None:
            crash = crash_signature(returncode)  # a crash is what this repro must do
            if crash.matches(expected):
                return Reproduced(crash, f"the process died ({crash.kind})", _tail(stderr), seconds)
        return Crashed(returncode, _tail(stderr or reply.get("message", "")), seconds)
    verdict = reply["verdict"]
    if verdict.get("status") == "passed":
        return Passed(seconds, _tail(str(reply.get("stdout", ""))))
    error = verdict["error"]
    signature = classify(
        error["type"],
        error["message"],
        stderr,
        error.get("op") or error.get("public_call"),
        error.get("error_code"),
    )
    message = str(error["message"])
    compare_op = compare_op and (synchronized or signature.error_code is None)
    if expected is not None and signature.matches(expected, compare_op=compare_op):
        return Reproduced(signature, message, _tail(stderr), seconds)
    return OtherFailure(signature, message, _tail(stderr), seconds)


def _tail(text: str) -> str:
    return text[-STDERR_TAIL:]


class Oracle:
    """Runs candidates in disposable processes; owns the fork server (started lazily)."""

    def __init__(
        self,
        expected: Signature | None = None,
        *,
        fork: bool = True,
        timeout: float = 60.0,
        compare_op: bool = True,
        standby_cuda: bool = False,
        launch_blocking: bool = False,
        confirm: Confirm | None = None,
    ) -> None:
        """`standby_cuda`: keep a child with its CUDA context made ready for the next check (see
        `prepare`). Only for emitted repro cases: a user's script may set up the environment
        CUDA reads when it starts. `launch_blocking`: children get CUDA_LAUNCH_BLOCKING=1 and
        synchronize after every op (localization; not what a plain run does). `confirm`: called
        with each Reproduced verdict, may replace it (a plain run's disagreement: ForkOnly)."""
        self.expected = expected
        self.launch_blocking = launch_blocking
        self.confirm = confirm
        self.fork = fork
        self.timeout = timeout
        self.compare_op = compare_op
        self.checks = 0
        self.seconds = 0.0
        self._tmp = tempfile.TemporaryDirectory(prefix="reprocut-oracle-")
        self.workdir = Path(self._tmp.name)
        self._server: subprocess.Popen[str] | None = None
        self.fork_disabled: str | None = None  # why the oracle fell back to fresh processes
        self._sidecar_keys: tuple[tuple[str, ...], int] | None = None
        self.standby_cuda = standby_cuda
        self._server_lock = threading.Lock()  # prepare() may come from another thread
        self.startup_seconds: float | None = None  # how long warm_up took to start the server

    # --- public API ---------------------------------------------------------------------------

    def check_case(
        self,
        case: ReproCase,
        inputs: Mapping[str, Any] | None = None,
        *,
        expected: Signature | None = None,
        timeout: float | None = None,
    ) -> Verdict:
        """Emit `case` as a script and run it (captured values inlined or put in a sidecar)."""
        if inputs:
            case = inline_captured(case, inputs)
        emitted = emit(case, Header(expected=case.expected))
        if emitted.sidecar_keys:
            self._write_sidecar(emitted.sidecar_keys, inputs or {})
        return self.check_source(
            emitted.code,
            filename=str(self.workdir / "repro.py"),
            cwd=self.workdir,
            argv=[],
            timeout=timeout,
            expected=expected or case.expected,
            fresh_child=bool(case.env),  # its env must be set before CUDA starts
        )

    def check_source(
        self,
        code: str,
        *,
        filename: str,
        cwd: Path | str,
        argv: list[str] | tuple[str, ...] = (),
        timeout: float | None = None,
        sys_path0: str | None = None,
        expected: Signature | None = None,
        fresh_child: bool = False,
    ) -> Verdict:
        """Run `code` as `__main__` (as `python filename argv...` from `cwd` would).
        `fresh_child`: not in a standby child whose CUDA context is made already."""
        request = {
            "code": code,
            "filename": str(filename),
            "cwd": str(cwd),
            "argv": list(argv),
            "sys_path0": sys_path0 or str(Path(filename).resolve().parent),
            "timeout": float(timeout or self.timeout),
            "sync": self.launch_blocking,
            "fresh_child": fresh_child,
        }
        started = time.perf_counter()
        if self.fork:
            with self._server_lock:
                reply = self._run_forked(request)
            self.prepare()  # the next check's child starts while this verdict is read
        else:
            reply = self._run_fresh(request)
        expected = expected or self.expected
        verdict = verdict_from_reply(
            reply, expected, compare_op=self.compare_op, synchronized=self.launch_blocking
        )
        if self.confirm is not None and isinstance(verdict, Reproduced):
            verdict = self.confirm(code, str(filename), str(cwd), list(argv), verdict, expected)
        self.checks += 1
        self.seconds += time.perf_counter() - started
        return verdict

    def warm_up(self) -> None:
        """Start the fork server now (it imports torch: seconds), e.g. while a script runs or a
        recording is read, on a thread of the caller's: checks that come meanwhile wait for it.
        A server that finds CUDA initialised sends the oracle to fresh processes, as a check
        would."""
        with self._server_lock:
            if self.fork and (self._server is None or self._server.poll() is not None):
                started = time.perf_counter()
                try:
                    self._server = self._start_server()
                except ForkUnsafeError as exc:
                    self.fork = False
                    self.fork_disabled = str(exc)
                    return
                self.startup_seconds = time.perf_counter() - started

    def prepare(self) -> int | None:
        """A check is coming: have the server fork its child now, so that the child's CUDA start
        overlaps whatever the caller does meanwhile. Needs `standby_cuda` and a running server.
        Returns the waiting child's pid, if there is one."""
        if not (self.fork and self.standby_cuda):
            return None
        with self._server_lock:
            server = self._server
            if server is None or server.poll() is not None or server.stdin is None:
                return None
            try:
                server.stdin.write(json.dumps({"standby": True, "cuda": True}) + "\n")
                server.stdin.flush()
            except (BrokenPipeError, OSError):
                return None
            line = self._read_line(server, SERVER_GRACE)
        return json.loads(line).get("pid") if line else None

    def close(self, *, wait: bool = True) -> None:
        """Kill the fork server and its children. `wait=False` does not wait for them to die:
        a process with a CUDA context can take a second to, and a caller about to exit need
        not (its children are then reaped by init)."""
        with self._server_lock:
            self._stop_server(wait=wait)
        self._tmp.cleanup()

    def __enter__(self) -> Oracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sidecar ------------------------------------------------------------------------------

    def _write_sidecar(self, keys: tuple[str, ...], inputs: Mapping[str, Any]) -> None:
        if self._sidecar_keys == (keys, id(inputs)):
            return
        import torch

        missing = [key for key in keys if key not in inputs]
        if missing:
            raise KeyError(f"captured tensors missing from the inputs file: {missing}")
        torch.save({key: inputs[key].detach().cpu() for key in keys}, self.workdir / SIDECAR_NAME)
        self._sidecar_keys = (keys, id(inputs))

    # --- fork server ----------------------------------------------------------------------------

    def _start_server(self) -> subprocess.Popen[str]:
        log = (self.workdir / "server.log").open("a")
        server = subprocess.Popen(
            [sys.executable, "-m", "reprocut.check.forkserver", "--parent", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=child_environment(blocking=self.launch_blocking),
            cwd=self.workdir,
            start_new_session=True,
        )
        log.close()
        lifeline.own(server.pid)
        line = self._read_line(server, STARTUP_TIMEOUT)
        ready = json.loads(line) if line else {}
        if not ready.get("ready"):
            self._kill(server)
            log_text = read_output(self.workdir / "server.log")
            raise RuntimeError(f"the fork server did not start:\n{log_text[-2000:]}")
        if ready.get("cuda_initialized"):
            self._kill(server)
            raise ForkUnsafeError("CUDA was initialised in the fork server before forking")
        return server

    def _run_forked(self, request: dict[str, Any]) -> dict[str, Any]:
        if self._server is None or self._server.poll() is not None:
            try:
                self._server = self._start_server()
            except ForkUnsafeError as exc:  # fall back to fresh processes, slower but safe
                self.fork = False
                self.fork_disabled = str(exc)
                return self._run_fresh(request)
        server = self._server
        assert server.stdin is not None
        try:
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
        except (BrokenPipeError, OSError):
            self._stop_server()
            return {"outcome": "crashed", "message": "the fork server died"}
        line = self._read_line(server, request["timeout"] + SERVER_GRACE)
        if line is None:  # the server itself hung or died: replace it
            self._stop_server()
            return {"outcome": "timeout", "seconds": request["timeout"]}
        return json.loads(line)

    @staticmethod
    def _read_line(server: subprocess.Popen[str], timeout: float) -> str | None:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], timeout)
        if not ready:
            return None
        line = server.stdout.readline()
        return line or None

    def _stop_server(self, *, wait: bool = True) -> None:
        if self._server is not None:
            self._kill(self._server, wait=wait)
            self._server = None

    @staticmethod
    def _kill(process: subprocess.Popen[str], *, wait: bool = True) -> None:
        try:
            if process.stdin:
                process.stdin.close()
        except OSError:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        lifeline.disown(process.pid)
        if wait:
            process.wait()
        if process.stdout:
            process.stdout.close()

    # --- fresh processes ------------------------------------------------------------------------

    def _run_fresh(self, request: dict[str, Any]) -> dict[str, Any]:
        request_path = self.workdir / "request.json"
        verdict_path = self.workdir / "verdict.json"
        out_path, err_path = self.workdir / "fresh-stdout.txt", self.workdir / "fresh-stderr.txt"
        request_path.write_text(json.dumps(request))
        verdict_path.unlink(missing_ok=True)
        started = time.perf_counter()
        with out_path.open("w") as out, err_path.open("w") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "reprocut.check.forkserver", "--once", str(request_path),
                 "--verdict", str(verdict_path), "--parent", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                env=child_environment(blocking=self.launch_blocking),
                cwd=request["cwd"], start_new_session=True,
            )  # fmt: skip
            with lifeline.owned(process.pid):
                returncode = run_with_timeout(process, request["timeout"])
        reply: dict[str, Any] = {
            "seconds": time.perf_counter() - started,
            "stdout": read_output(out_path),
            "stderr": read_output(err_path),
            "returncode": returncode,
        }
        if returncode is None:
            reply["outcome"] = "timeout"
        elif verdict_path.exists():
            reply["outcome"] = "done"
            reply["verdict"] = json.loads(verdict_path.read_text())
        else:
            reply["outcome"] = "crashed"
        return reply


def run_with_timeout(process: subprocess.Popen[Any], timeout: float) -> int | None:
    """Wait for a process started with start_new_session; kill its whole group on timeout."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # leftovers of the group
