"""The fork server of `reprocut shrink`, started before the command imports the rest of itself.

The server's `import torch` is the longest wait of a shrink (4.7 s on an H200 host), and the
command's own imports (libcst, rich, the pipeline: about a second there) need not come first.
`spawn` starts the server at once, in an oracle folder of its own, without waiting for it; the
shrink's Oracle `take`s it if it was started with the environment that oracle would give its
own. One that nobody takes (--help, a usage error, a shrink that needs no server) is killed by
`discard`, which the command calls when it ends (atexit as well, for other exits); killing
reprocut kills it too (it is `lifeline`-owned and watches its --parent).

Light on purpose: stdlib and reprocut's light process helpers only (no torch, libcst, rich).
"""

from __future__ import annotations

import atexit
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from reprocut.check.childenv import child_environment
from reprocut.check.connection import kill_server, spawn_server


@dataclass(frozen=True, slots=True)
class EarlyServer:
    """A fork server started ahead, and the folder it runs in (the taker's workdir)."""

    folder: tempfile.TemporaryDirectory[str]
    server: subprocess.Popen[str]
    env: dict[str, str]
    started: float  # time.monotonic() at the spawn

    def close(self) -> None:
        kill_server(self.server)
        self.folder.cleanup()


_slot: EarlyServer | None = None
_lock = threading.Lock()


def spawn() -> None:
    """Start the server an Oracle of the shrink would start (fork, no launch blocking)."""
    global _slot
    with _lock:
        if _slot is not None:
            return
        env = child_environment(blocking=False, one_connection=True)
        folder = tempfile.TemporaryDirectory(prefix="reprocut-oracle-")
        try:
            server = spawn_server(Path(folder.name), env)
        except OSError:  # the Oracle will start one itself, or say why it cannot
            folder.cleanup()
            return
        _slot = EarlyServer(folder, server, env, time.monotonic())


def take(env: dict[str, str]) -> EarlyServer | None:
    """The early server, handed over once, if it was started with `env` and still runs; one
    that does not fit is killed (the caller starts its own)."""
    global _slot
    with _lock:
        early, _slot = _slot, None
    if early is None:
        return None
    if early.env == env and early.server.poll() is None:
        return early
    early.close()
    return None


def discard() -> None:
    """Kill the early server if nobody took it."""
    global _slot
    with _lock:
        early, _slot = _slot, None
    if early is not None:
        early.close()


atexit.register(discard)  # a server still untaken when the interpreter exits (a no-op if none)
