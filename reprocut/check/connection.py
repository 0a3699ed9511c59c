"""The oracle's side of the fork server's line protocol, with several requests in flight.

Each request goes out as one JSON line with an id; the server answers each with one line
carrying that id, in the order its children finish. A reader thread files every reply under
its id and wakes the thread waiting for it, so checks run side by side (the source reducer's
speculative candidates) each wait for their own answer. A `Ticket` lets another thread cancel
a check in flight: the server kills that child and answers "cancelled".
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from reprocut.check import lifeline
from reprocut.check.forkchild import read_output

STARTUP_TIMEOUT = 120.0


class ForkUnsafeError(RuntimeError):
    """The server's parent has CUDA initialised: forked children would inherit a broken context."""


def start_server(
    workdir: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """`python -m reprocut.check.forkserver`, once it said it is ready (it imports torch), and
    what it said (the seconds its import and warm-up took)."""
    server = spawn_server(workdir, env)
    return server, await_ready(server, workdir)


def spawn_server(workdir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """The server process, started and owned (it dies with reprocut), not waited for: `reprocut
    shrink` starts it before importing the rest of itself (check/early_server.py)."""
    log = (workdir / "server.log").open("a")
    server = subprocess.Popen(
        [sys.executable, "-m", "reprocut.check.forkserver", "--parent", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        cwd=workdir,
        start_new_session=True,
    )
    log.close()
    lifeline.own(server.pid)
    return server


def await_ready(server: subprocess.Popen[str], workdir: Path) -> dict[str, Any]:
    """What a started server says once ready; a server that cannot serve is killed."""
    line = _read_line(server, STARTUP_TIMEOUT)
    ready = json.loads(line) if line else {}
    if not ready.get("ready"):
        kill_server(server)
        log_text = read_output(workdir / "server.log")
        raise RuntimeError(f"the fork server did not start:\n{log_text[-2000:]}")
    if ready.get("cuda_initialized"):
        kill_server(server)
        raise ForkUnsafeError("CUDA was initialised in the fork server before forking")
    return ready


def _read_line(server: subprocess.Popen[str], timeout: float) -> str | None:
    assert server.stdout is not None
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    if not ready:
        return None
    line = server.stdout.readline()
    return line or None


def kill_server(process: subprocess.Popen[str], *, wait: bool = True) -> None:
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


class Replies:
    """Requests to one running server and the replies it sends back, matched by id."""

    def __init__(self, server: subprocess.Popen[str]) -> None:
        self.server = server
        self._write = threading.Lock()
        self._arrived = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._next = 0
        self.closed = False  # the server's stdout ended: no more replies will come
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, request: dict[str, Any]) -> int | None:
        """Write the request; its id, or None when the server is gone."""
        with self._write:
            self._next += 1
            rid = self._next
            if not self._write_line({**request, "id": rid}):
                return None
        return rid

    def cancel(self, rid: int) -> None:
        """Ask the server to kill request `rid`'s child (its reply then says "cancelled")."""
        with self._write:
            self._write_line({"cancel": rid})

    def wait(self, rid: int, timeout: float) -> dict[str, Any] | None:
        """Request `rid`'s reply; None when none came within `timeout` or the server is gone."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while rid not in self._replies:
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    return None
                self._arrived.wait(left)
            return self._replies.pop(rid)

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        rid = self.send(request)
        return None if rid is None else self.wait(rid, timeout)

    def _write_line(self, message: dict[str, Any]) -> bool:
        stdin = self.server.stdin
        if stdin is None:
            return False
        try:
            stdin.write(json.dumps(message) + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return False
        return True

    def _read(self) -> None:
        stdout = self.server.stdout
        with contextlib.suppress(OSError, ValueError):
            for line in stdout or ():
                try:
                    reply = json.loads(line)
                except json.JSONDecodeError:
                    continue
                with self._arrived:
                    self._replies[reply.get("id")] = reply
                    self._arrived.notify_all()
        with self._arrived:
            self.closed = True
            self._arrived.notify_all()


class Ticket:
    """A handle on one check, for cancelling it from another thread (before or while it runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: tuple[Replies, int] | None = None
        self.cancelled = False
        # checks of the same reducer before this one, not yet taken: 0 for the one it waits
        # on, more for one run ahead of its turn (reprocut.check.machine_slots ranks by it)
        self.ahead = 0

    def bind(self, replies: Replies, rid: int) -> None:
        with self._lock:
            self._sent = (replies, rid)
            if self.cancelled:
                replies.cancel(rid)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._sent is not None:
                self._sent[0].cancel(self._sent[1])
