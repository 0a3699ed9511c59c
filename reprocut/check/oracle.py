"""Does this candidate still fail the same way? Each check runs in a disposable process.

A child's failure is data, not an exception: every check returns one Verdict. By default the
checks go to a fork server (`reprocut.check.forkserver`) that has torch imported already; `fork=False`
runs each check in a fresh `python` instead (slower, but no shared parent at all).

A check runs the candidate the way the user's `python repro.py` will: no CUDA_LAUNCH_BLOCKING and
no synchronization after each op (`launch_blocking=True` is for localization, where a fault must
raise at the op that launched it). An asynchronous CUDA error then surfaces where it would in a
plain run, so its op is not compared. What a forked child cannot show (state inherited from the
server) a `confirm` hook may settle with a plain run (`reprocut.check.agreement`).

Checks may come from several threads at once (the source reducer runs candidates side by side):
each waits for its own reply (`reprocut.check.connection`), and a `Ticket` cancels one in
flight. `preload` has the server import the user's installed packages once for every child
(`reprocut.check.preload`).
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprocut.check import check_log, early_server
from reprocut.check.case_script import case_filename, emitted_case
from reprocut.check.childenv import child_environment
from reprocut.check.connection import (
    ForkUnsafeError,
    Replies,
    Ticket,
    await_ready,
    kill_server,
    start_server,
)
from reprocut.check.connections import ConnectionChoice
from reprocut.check.fresh import run_fresh, run_with_timeout
from reprocut.check.machine_slots import MachineSlots
from reprocut.check.server_preload import ServerPreload
from reprocut.check.sidecars import Sidecars
from reprocut.check.verdicts import (
    Cancelled,
    Confirm,
    Crashed,
    ForkOnly,
    OtherFailure,
    Passed,
    Reproduced,
    TimedOut,
    Verdict,
    verdict_from_reply,
)
from reprocut.model.case import ReproCase, Signature

__all__ = [
    "Cancelled",
    "Confirm",
    "Crashed",
    "ForkOnly",
    "ForkUnsafeError",
    "Oracle",
    "OtherFailure",
    "Passed",
    "Reproduced",
    "Ticket",
    "TimedOut",
    "Verdict",
    "child_environment",
    "run_with_timeout",
    "verdict_from_reply",
]
SERVER_GRACE = 30.0  # seconds the server may take beyond a check's own timeout before we give up


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
        self._created = time.monotonic()
        # `reprocut shrink`'s server, started before the command's imports: its folder is ours
        self.connection = ConnectionChoice(blocking=launch_blocking)  # check/connections.py
        self._early = (
            early_server.take(child_environment(blocking=False, one_connection=True))
            if fork and not launch_blocking
            else None
        )
        self._tmp = (
            self._early.folder
            if self._early
            else tempfile.TemporaryDirectory(prefix="reprocut-oracle-")
        )
        self.workdir = Path(self._tmp.name)
        self._server: subprocess.Popen[str] | None = None
        self._replies: Replies | None = None
        self._preload = ServerPreload()  # what each server imports for its children
        self._counts = threading.Lock()
        self.fork_disabled: str | None = None  # why the oracle fell back to fresh processes
        self.sidecars = Sidecars()  # the captured tensors each check's folder holds
        self.standby_cuda = standby_cuda
        # how many such children wait at once: each check of a device assert ends its child's
        # context, and a child's CUDA start (0.3 s on an H200) is longer than the check itself
        self.standby_depth = 1
        self._server_lock = threading.Lock()  # prepare() may come from another thread
        self.startup_seconds: float | None = None  # how long warm_up took to start the server
        # the server's own seconds (import_torch, warm_up); for a server the command started
        # ahead, started_early and started_ahead_s (how long before this oracle existed)
        self.server_seconds: dict[str, Any] = {}
        # a plain interpreter started ahead (check/warmer.py: at record's first CUDA error) for
        # the shrink's first plain confirmation, which would otherwise wait for its torch import;
        # a check.plainrun.PlainRunner (plainrun imports this module, so not named in its type)
        self.plain_ahead: Any = None
        # a check waits for one of the machine's check slots, shared by every shrink on it
        self.machine_slots = MachineSlots()

    # --- public API ---------------------------------------------------------------------------

    def check_case(
        self,
        case: ReproCase,
        inputs: Mapping[str, Any] | None = None,
        *,
        expected: Signature | None = None,
        timeout: float | None = None,
        workdir: Path | None = None,
        ticket: Ticket | None = None,
        leave_standby: bool = False,
        sidecar_file: Path | None = None,
        confirm: bool = True,
    ) -> Verdict:
        """Emit `case` as a script and run it (captured values inlined or put in a sidecar).
        `workdir`: a folder of its own for the script and sidecar (the oracle's by default), for
        a check running beside others; `ticket`, `leave_standby` and `confirm` as for
        `check_source` (`emitted_case` and `case_filename` give what `confirm_verdict` takes).
        `sidecar_file`: a file of captured tensors (the recording's) that the script loads as
        its sidecar, linked as it is: no values are read here, so no torch import."""
        folder = workdir or self.workdir
        emitted = emitted_case(case, inputs)
        if emitted.sidecar_keys and sidecar_file is not None:
            self.sidecars.link(folder, sidecar_file)
        elif emitted.sidecar_keys:
            self.sidecars.write(emitted.sidecar_keys, inputs or {}, folder)
        filename = case_filename(case, emitted.code, folder)
        if case.definitions:  # a custom op's code: `@triton.jit` reads its source from the file
            filename.write_text(emitted.code)
        try:
            return self.check_source(
                emitted.code,
                filename=str(filename),
                cwd=folder,
                argv=[],
                timeout=timeout,
                expected=expected or case.expected,
                fresh_child=bool(case.env),  # its env must be set before CUDA starts
                ticket=ticket,
                leave_standby=leave_standby,
                confirm=confirm,
            )
        finally:
            if case.definitions:  # one file per candidate: gone once its check has run
                filename.unlink(missing_ok=True)

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
        confirm: bool = True,
        ticket: Ticket | None = None,
        leave_standby: bool = False,
    ) -> Verdict:
        """Run `code` as `__main__` (as `python filename argv...` from `cwd` would).
        `fresh_child`: not in a standby child whose CUDA context is made already. `confirm=False`:
        the caller applies the confirm hook itself (`confirm_verdict`), in an order of its own.
        `ticket`: lets another thread cancel this check (its verdict is then `Cancelled`).
        `leave_standby`: in a child forked for it, the standby child left to the next check (for
        a check beside others that needs no CUDA context: the CPU one)."""
        request = {
            "code": code,
            "filename": str(filename),
            "cwd": str(cwd),
            "argv": list(argv),
            "sys_path0": sys_path0 or str(Path(filename).resolve().parent),
            "timeout": float(timeout or self.timeout),
            "sync": self.launch_blocking,
            "fresh_child": fresh_child,
            "leave_standby": leave_standby,
        }
        started = time.perf_counter()
        if ticket is not None and ticket.cancelled:
            return Cancelled(0.0)
        # the server ready (its imports, a preload) before a slot is taken: no slot waits on it
        ready = self._ready_server() if self.fork else None
        with self.machine_slots.held(
            lambda: ticket is not None and ticket.cancelled,
            ahead=lambda: 0 if ticket is None else ticket.ahead,
        ) as waited:
            if waited is None:  # cancelled while waiting for a slot: it never ran
                return Cancelled(time.perf_counter() - started)
            if ready is not None:
                reply = self._run_forked(request, ready, ticket)
            else:
                reply = self._run_fresh(request)
        if self.fork and not leave_standby:
            self.prepare()  # the next check's child starts while this verdict is read
        expected = expected or self.expected
        verdict = verdict_from_reply(
            reply, expected, compare_op=self.compare_op, synchronized=self.launch_blocking
        )
        verdict, switched = (verdict, False) if expected is None else self.connection.first_verdict(
            reply,
            verdict,
            rerun_without=lambda env: verdict_from_reply(
                run_fresh(request, self.workdir, env), expected,
                compare_op=self.compare_op, synchronized=self.launch_blocking,
            ),
        )  # fmt: skip
        if switched:  # the next check starts a server without the setting
            self._stop_server()
        check_log.log_check(verdict, reply, time.perf_counter() - started, waited, code,
                            filename=Path(filename).name, fork=self.fork, fresh_child=fresh_child)  # fmt: skip
        if confirm:
            verdict = self.confirm_verdict(code, str(filename), str(cwd), list(argv), verdict,
                                           expected)  # fmt: skip
        with self._counts:
            self.checks += 1
            self.seconds += time.perf_counter() - started
        return verdict

    def confirm_verdict(
        self,
        code: str,
        filename: str,
        cwd: str,
        argv: list[str],
        verdict: Verdict,
        expected: Signature | None = None,
    ) -> Verdict:
        """The confirm hook's word on a Reproduced verdict (a plain run may disagree)."""
        if self.confirm is None or not isinstance(verdict, Reproduced):
            return verdict
        return self.confirm(code, filename, cwd, argv, verdict, expected or self.expected)

    @property
    def preloaded(self) -> dict[str, Any] | None:
        """The server's reply to the preload: what it loaded, refused, and why."""
        return self._preload.reply

    def preload(
        self, modules: list[list[Any]], *, filename: str, cwd: str, argv: list[str]
    ) -> None:
        """Have the fork server import these (`[module, [names]]`, see check/preload.py) once,
        as the script at `filename` would, before its next children: now if it runs, else as
        it starts. Checks wait for it; `preloaded` then says what it loaded and refused."""
        self._preload.choose(modules, filename=filename, cwd=cwd, argv=argv)
        if self.fork and self._server_lock.acquire(blocking=False):
            try:
                if self._server is not None and self._server.poll() is None:
                    assert self._replies is not None
                    self._preload.send(self._replies)
            finally:
                self._server_lock.release()

    def preload_more(self, modules: list[list[Any]]) -> None:
        """Have the running fork server import these too, now (its next children wait for them;
        those at work are answered once the import ends), and every later server with the rest
        of its preload. For imports only some checks need (check/preload.py `deferred`)."""
        with self._server_lock:
            if not (self.fork and modules):
                return
            running = self._server is not None and self._server.poll() is None
            if not self._preload.more(modules, self._replies if running else None):
                self._stop_server()  # unfit to fork: the next server imports torch only

    def warm_up(self) -> None:
        """Start the fork server now (it imports torch: seconds), e.g. while a script runs or a
        recording is read, on a thread of the caller's: checks that come meanwhile wait for it.
        A server that finds CUDA initialised sends the oracle to fresh processes, as a check
        would."""
        with self._server_lock:
            if self.fork and (self._server is None or self._server.poll() is not None):
                started = time.perf_counter()
                try:
                    self._connect()
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
        request = {"standby": True, "cuda": True, "depth": self.standby_depth}
        with self._server_lock:
            server, replies = self._server, self._replies
            if server is None or server.poll() is not None or replies is None:
                return None
            reply = replies.call(request, SERVER_GRACE)
        return reply.get("pid") if reply else None

    def close(self, *, wait: bool = True) -> None:
        """Kill the fork server and its children. `wait=False` does not wait for them to die:
        a process with a CUDA context can take a second to, and a caller about to exit need
        not (its children are then reaped by init)."""
        with self._server_lock:
            self._stop_server(wait=wait)
        if self.plain_ahead is not None:  # not taken by a shrink
            self.plain_ahead.close()
            self.plain_ahead = None
        self._tmp.cleanup()

    def __enter__(self) -> Oracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- fork server ----------------------------------------------------------------------------

    def _start_server(self) -> subprocess.Popen[str]:
        early, self._early = self._early, None
        if early is not None and early.server.poll() is None:
            ready = await_ready(early.server, self.workdir)
            ahead = round(self._created - early.started, 3)
            self.server_seconds = {
                **ready.get("seconds", {}),
                "started_early": True,
                "started_ahead_s": ahead,
            }
            return early.server
        if early is not None:  # it died before it was needed: start another
            kill_server(early.server)
        server, ready = start_server(self.workdir, self.connection.environment())
        self.server_seconds = ready.get("seconds") or {}
        return server

    def _connect(self) -> None:
        """Start a server and its reply reader (the caller holds the server lock)."""
        self._server = self._start_server()
        self._replies = Replies(self._server)
        self._preload.send(self._replies)

    def _ready_server(self) -> tuple[subprocess.Popen[str], Replies] | None:
        """The running server and its replies, started (and its preload awaited) if need be;
        None when it cannot fork (the oracle then runs fresh processes)."""
        with self._server_lock:
            for _ in range(2):
                if self._server is None or self._server.poll() is not None:
                    try:
                        self._connect()
                    except ForkUnsafeError as exc:  # fall back to fresh processes, slower but safe
                        self.fork = False
                        self.fork_disabled = str(exc)
                        return None
                assert self._replies is not None
                if self._preload.answered(self._replies):
                    break
                self._stop_server()  # unfit to fork: replaced by one without preloads
            assert self._server is not None and self._replies is not None
            return self._server, self._replies

    def _run_forked(
        self,
        request: dict[str, Any],
        ready: tuple[subprocess.Popen[str], Replies],
        ticket: Ticket | None = None,
    ) -> dict[str, Any]:
        server, replies = ready
        rid = replies.send(request)
        if rid is None:
            self._stop_server(only=server)
            return {"outcome": "crashed", "message": "the fork server died"}
        if ticket is not None:
            ticket.bind(replies, rid)
        reply = replies.wait(rid, request["timeout"] + SERVER_GRACE)
        if reply is None:  # the server itself hung or died: replace it
            self._stop_server(only=server)
            return {"outcome": "timeout", "seconds": request["timeout"]}
        return reply

    def _stop_server(self, *, wait: bool = True, only: subprocess.Popen[str] | None = None) -> None:
        """Kill the server (`only`: if it is still that one; from a check's thread)."""
        if only is not None:
            with self._server_lock:
                if self._server is only:
                    self._stop_server(wait=wait)
            return
        if self._server is not None:
            kill_server(self._server, wait=wait)
            self._server = None
            self._replies = None
        if self._early is not None:  # taken from the command, never needed
            kill_server(self._early.server, wait=wait)
            self._early = None

    # --- fresh processes ------------------------------------------------------------------------

    def _run_fresh(self, request: dict[str, Any]) -> dict[str, Any]:
        return run_fresh(request, self.workdir, self.connection.environment())
