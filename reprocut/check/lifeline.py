"""Every process reprocut starts ends when reprocut ends, however reprocut ends.

Children run in process groups of their own (so that a timeout kills a script's whole tree), which
also means a terminal's Ctrl-C, a scheduler's SIGTERM or a closed terminal's SIGHUP reaches only
reprocut: left alone, the user's script would run on under PID 1, holding its GPU. Two halves:

- reprocut's side: each child's group is `owned` while it runs; SIGTERM, SIGHUP and SIGINT kill
  every owned group before reprocut goes the way the signal says (`install_signal_handlers`).
- the child's side, for what no handler sees (SIGKILL, the OOM killer): the child watches its
  parent's pid and, once it is gone, ends its own group (`end_group_with_parent`), or just
  itself where its group does not matter (`exit_with_parent`: PR_SET_PDEATHSIG on Linux).

Imports nothing heavy: the fork server and the record child load it before torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

POLL_SECONDS = 0.2  # how often a child looks for its parent: a getppid() call, nothing more
SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name)
)
_PR_SET_PDEATHSIG = 1

_owned: set[int] = set()
_lock = threading.RLock()  # re-entrant: the signal handler may interrupt its holder
_installed: dict[int, Any] = {}


# --- reprocut's side ---------------------------------------------------------------------------


@contextlib.contextmanager
def owned(pgid: int) -> Iterator[None]:
    """While the block runs, the process group `pgid` dies with reprocut (see the handlers)."""
    with _lock:
        _owned.add(pgid)
    try:
        yield
    finally:
        with _lock:
            _owned.discard(pgid)


def own(pgid: int) -> None:
    """`owned` for a group that outlives a block (the fork server): `disown` it when killed."""
    with _lock:
        _owned.add(pgid)


def disown(pgid: int) -> None:
    with _lock:
        _owned.discard(pgid)


def kill_owned_groups() -> None:
    """SIGKILL every owned group: a child that hit a CUDA error may not die of anything less."""
    with _lock:
        groups = list(_owned)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def install_signal_handlers() -> None:
    """On SIGTERM, SIGHUP or SIGINT, kill the owned groups first, then do what the signal did
    before: SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP end the process with that
    signal (its exit status says so). Only the main thread may install handlers: elsewhere
    this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in SIGNALS:
        if signum in _installed:
            continue
        previous = signal.getsignal(signum)
        if previous is signal.SIG_IGN:  # nohup: the user asked for this signal to be ignored
            continue
        _installed[signum] = previous
        signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame: Any) -> None:
    kill_owned_groups()
    previous = _installed.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# --- the child's side --------------------------------------------------------------------------


def end_group_with_parent(parent: int | None, on_orphan: Callable[[], None] | None = None) -> None:
    """A daemon thread that, once `parent` is gone, runs `on_orphan` and SIGKILLs this process's
    group (this process with it). For group leaders: the user's script and whatever it started.

    A thread, not PR_SET_PDEATHSIG: that signal would end this process alone and leave the rest
    of its group running, with nobody left to end them."""
    if parent is None:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        if on_orphan is not None:
            with contextlib.suppress(BaseException):
                on_orphan()
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="reprocut-lifeline", daemon=True).start()


def exit_with_parent(parent: int) -> bool:
    """This process gets SIGKILL when its parent dies (Linux PR_SET_PDEATHSIG; True if set).
    For a child forked by a single-threaded parent: the signal fires when the *thread* that
    forked it ends. A parent gone before the call is caught too."""
    armed = _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
    return armed


def _set_parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def run(command: list[str], *, timeout: float, **popen: Any) -> int | None:
    """`subprocess.run` for a child in a group of its own, owned while it runs and killed whole
    on timeout (None then); its exit status otherwise."""
    process = subprocess.Popen(command, start_new_session=True, **popen)
    try:
        with owned(process.pid):
            return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # on timeout, and anything left in the group
        process.wait()
