"""`python -m reprocut.check.forkserver`: pay `import torch` once, run each candidate in a forked child.

The server sets the NVML-based CUDA check *before* importing torch, imports torch and never
touches `torch.cuda` (that would poison fork for the children). Its children run as a plain
`python repro.py` would: no CUDA_LAUNCH_BLOCKING unless the oracle's environment (or the
candidate itself, before it initialises CUDA) sets it, and no synchronization after each op
unless the request asks for it (`sync`: localization does; checks of candidates do not). For each
JSON-line request on stdin ({id, code, filename, cwd, argv, sys_path0, timeout}) it forks a child
that gets its own process group, writes stdout/stderr to files, runs the code as `__main__` under
FaultAttribution, sends its verdict through a pipe and leaves with `os._exit` (no destructors: a
process after a sticky CUDA error can hang in teardown). Several children may be at work at once
(the oracle checks candidates side by side); each reply is one JSON line carrying its request's
id, written when that child is done, killed on timeout or cancelled (`{"cancel": id}`). A
request runs in the oldest standby child (`{"standby": true, "depth": n}` keeps n of them
waiting, their CUDA contexts starting side by side) if there is one, unless it says `fresh_child`
(the standbys are then discarded) or `leave_standby` (kept for the next requests).
`{"preload": [...]}` imports the user's script's installed packages once, here, for every later
child (check/preload.py). `--once REQUEST` runs one request in this very process (the
fresh-process mode of the oracle). With `--parent PID`, the server and its children end once that
process (reprocut) is gone, even if it was SIGKILLed (see lifeline).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from reprocut import silence_torch_import_warnings
from reprocut.check import lifeline
from reprocut.check.childenv import BLOCKING_ENV, FORK_ENV
from reprocut.check.forkchild import (
    Running,
    Standby,
    flush_streams,
    kill_group,
    read_output,
    run_request,
    serve_one,
)

__all__ = ["BLOCKING_ENV", "FORK_ENV", "main", "read_output", "run_request", "serve"]

POLL_SECONDS = 0.005  # a child's end wakes the loop at once (its pipe closes); this is the fallback
_parent: int | None = None  # reprocut's pid (--parent): once it is gone, the server ends


def _set_environment() -> None:
    os.environ.update(FORK_ENV)


def _preload() -> dict[str, float]:
    """What every child needs, imported once in the server (none of it touches CUDA); the
    seconds each part took (the server's start is the first check's wait)."""
    started = time.perf_counter()
    import torch
    import torch.nn.functional

    imported = time.perf_counter()
    from reprocut.check import attribution
    from reprocut.model.publicapi import _public_index

    _public_index()  # build the public-name index once, before forking
    # the first op under the modes warms their code paths once (torch._dynamo stays unimported)
    if os.environ.get("REPROCUT_FORKSERVER_WARMUP", "1") != "0":
        with attribution.FaultAttribution():
            torch.nn.functional.embedding(torch.tensor([0]), torch.zeros(1, 1)).sum().item()
    done = time.perf_counter()
    return {"import_torch": round(imported - started, 3), "warm_up": round(done - imported, 3)}


def serve(stdin: Any, stdout: Any) -> None:
    """The request loop: JSON lines in; one JSON line out per request, as each is done."""
    seconds = _preload()
    import torch

    ready = {
        "ready": True,
        "pid": os.getpid(),
        "seconds": seconds,
        "torch": torch.__version__,
        # a parent with CUDA initialised would poison every forked child: the oracle checks this
        "cuda_initialized": bool(torch.cuda.is_initialized()),
    }
    stdout.write(json.dumps(ready) + "\n")
    stdout.flush()
    with tempfile.TemporaryDirectory(prefix="reprocut-fork-") as tmp:
        _Loop(Path(tmp), stdout).run(stdin.fileno())


class _Loop:
    """The server's state between requests: children at work, standby children, the replies."""

    def __init__(self, workdir: Path, stdout: Any) -> None:
        self.workdir = workdir
        self.stdout = stdout
        self.running: dict[int, Running] = {}  # by the read end of each child's verdict pipe
        self.standbys: deque[Standby] = deque()  # oldest first: the likeliest to be ready
        self.serial = 0

    def run(self, stdin_fd: int) -> None:
        pending = b""
        stdin_open = True
        try:
            while stdin_open or self.running:
                fds = [stdin_fd] if stdin_open else []
                readable, _, _ = select.select([*fds, *self.running], [], [], POLL_SECONDS)
                if stdin_fd in readable:
                    data = os.read(stdin_fd, 65536)
                    stdin_open = bool(data)
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self.handle(line)
                    if not stdin_open:  # reprocut closed the pipe: nobody wants the replies
                        for child in self.running.values():
                            child.cancel()
                for fd, child in list(self.running.items()):
                    reply = child.poll()
                    if reply is not None:
                        del self.running[fd]
                        self.answer(reply)
                if _parent is not None and os.getppid() != _parent:  # reprocut is gone
                    for child in self.running.values():
                        kill_group(child.pid)
                    os._exit(1)
        finally:
            self.discard_standbys()

    def discard_standbys(self) -> None:
        while self.standbys:
            self.standbys.popleft().discard()

    def answer(self, reply: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(reply) + "\n")
        self.stdout.flush()

    def handle(self, line: bytes) -> None:
        request: dict[str, Any] = {}
        try:
            request = json.loads(line)
            if "cancel" in request:
                for child in self.running.values():
                    if child.request.get("id") == request["cancel"]:
                        child.cancel()  # its reply says "cancelled" once it is reaped
                return
            if request.get("standby"):
                while len(self.standbys) < max(1, int(request.get("depth", 1))):
                    self.standbys.append(Standby.fork(cuda=bool(request.get("cuda"))))
                pid = self.standbys[0].pid
                self.answer({"outcome": "standby", "pid": pid, "id": request.get("id")})
                return
            if "preload" in request:
                from reprocut.check.preload import preload_here

                self.answer({**preload_here(request), "id": request.get("id")})
                return
            self.serial += 1
            workdir = self.workdir / f"r{self.serial}"
            workdir.mkdir()
            if request.get("leave_standby"):  # a check beside others: the standby is theirs
                child = serve_one(request, workdir)
            elif self.standbys and not request.get("fresh_child"):
                child = self.standbys.popleft().start(request, workdir)
            else:  # a candidate that sets the environment CUDA reads must start it
                self.discard_standbys()
                child = serve_one(request, workdir)
            self.running[child.read_fd] = child
        except Exception as exc:  # a broken request must not take the server down
            self.answer({"outcome": "error", "message": repr(exc), "id": request.get("id")})


def run_once(request_path: Path, verdict_path: Path) -> None:
    """Fresh-process mode: this process is the child; the oracle owns the timeout and the files."""
    import faulthandler

    faulthandler.enable()
    request = json.loads(request_path.read_text())
    verdict = run_request(request)
    flush_streams()
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
