"""One rank of a torchrun job: `python -m reprocut.record.ranks.rank CONFIG.json`, started by
torchrun.

torchrun gives each rank RANK, LOCAL_RANK, WORLD_SIZE, ...; this bootstrap (it never imports
torch) runs the user's script under the recorder exactly as `reprocut record` runs one process
(record/parent/runner.py: a child process, teed output, its outcome; the script sees the
sys.argv, sys.path[0] and `-u` that torchrun would have given it, a module runs as under `-m`),
into the rank's own folder, and leaves rank.json there: how the rank's process ran and ended, and whether torchrun
stopped it. It exits as the script did, so torchrun sees the job it would have seen.

When one rank fails, torchrun stops the others with SIGTERM. The script's process then gets a
moment to finish its own report (it may be failing in a collective at that very moment) before
it is stopped too.

In a rerun of the job to localize one rank's failure (the config's `target`), that rank runs
under the recorder as a single-process rerun does (its attempt names the files, its RunRequest
fields say how: the steps to synchronize in, blocking launches), and every other rank runs
plainly, `python -u SCRIPT ARGS` as torchrun would start it, its output teed to its folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from reprocut.model.job import rank_file, rank_path
from reprocut.model.launch import Launch
from reprocut.model.recording import atomic_write
from reprocut.record.parent.runner import RunRequest, _tee, child_env, run_script

GRACE_S = 1.0  # after torchrun's SIGTERM: time the script may take to write its outcome
KILL_AFTER_S = 3.0  # then SIGTERM to the script; SIGKILL this much later


class RankProcess:
    """rank.json's content, kept current on disk, and the stop torchrun asks for."""

    def __init__(self, folder: Path, record: dict[str, Any], attempt: str = "record") -> None:
        self.folder = folder
        self.record = record
        self.path = folder / rank_file(attempt)
        self.child: subprocess.Popen[bytes] | None = None
        self._writing = False  # torchrun's signal may come while the main thread writes
        self._again = False
        self.write()

    def write(self) -> None:
        """The record as it is now. A write from the signal handler while the main thread is
        writing (the handler runs inside it) is left to that write, which then writes again:
        the last file written always has the newest record."""
        if self._writing:
            self._again = True
            return
        self._writing = True
        try:
            while True:
                self._again = False
                atomic_write(self.path, json.dumps(self.record, indent=1))
                if not self._again:
                    return
        finally:
            self._writing = False

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        self.record["child_pid"] = child.pid
        self.write()
        if self.record.get("terminated_by"):  # the stop came before the child existed
            self._stop_soon()

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.record.get("terminated_by"):
            return
        self.record["terminated_by"] = signal.Signals(signum).name
        self.record["terminated_at"] = time.time()
        self.write()
        self._stop_soon()

    def _stop_soon(self) -> None:
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self) -> None:
        child = self.child
        if child is None:
            return
        time.sleep(GRACE_S)
        for sig, wait in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, 0.0)):
            if child.returncode is not None:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, sig)
            time.sleep(wait)


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    env = os.environ
    rank = int(env.get("RANK", "0"))
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    folder = rank_path(Path(config["job_dir"]), rank, restart)
    folder.mkdir(parents=True, exist_ok=True)
    target = config.get("target")  # a rerun of the job: the rank it localizes, and how
    attempt = target["attempt"] if target else "record"
    process = RankProcess(
        folder,
        {
            "rank": rank,
            "local_rank": int(env.get("LOCAL_RANK", "0")),
            "world_size": int(env.get("WORLD_SIZE", "1")),
            "group_rank": int(env.get("GROUP_RANK", "0")),
            "restart": restart,
            "node": config.get("node", ""),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "child_pid": None,
            "started": time.time(),
            "ended": None,
            "returncode": None,
            "signal": None,
            "terminated_by": None,
            "plain": bool(target) and rank != target["rank"],
        },
        attempt,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, process.on_signal)
    launch = Launch(  # as torchrun launches the rank: `python -u (SCRIPT | -m MODULE) ARGS`
        script=Path(config["script"]),
        module=config.get("module"),
        args=tuple(config["argv"]),
        argv0=config.get("argv0") or config["script"],
        python_options=tuple(config.get("python_options", ())),
    )
    echo = {
        "echo_stdout": None if config.get("quiet") else sys.stdout,
        "echo_stderr": None if config.get("quiet") else sys.stderr,
    }
    start = time.monotonic()
    if process.record["plain"]:
        returncode, sig = run_plain(launch, folder, attempt, Path(config["cwd"]), process, **echo)
    else:
        how = dict(target["how"]) if target else {}
        result = run_script(
            RunRequest(
                Path(config["script"]),
                launch.args,
                folder,
                attempt,
                snapshots=False if target else config.get("snapshots", True),
                light_steps=None if target else config.get("light_steps"),
                cwd=Path(config["cwd"]),
                launch=launch,
                **how,
            ),
            on_start=process.started,
            **echo,
        )
        returncode, sig = result.returncode, result.signal
    process.record.update(
        ended=time.time(),
        returncode=returncode,
        signal=sig,
        seconds=round(time.monotonic() - start, 3),
    )
    process.write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(returncode if returncode is not None else 128 + (sig or 0))


def run_plain(
    launch: Launch,
    folder: Path,
    attempt: str,
    cwd: Path,
    process: RankProcess,
    *,
    echo_stdout: IO[str] | None,
    echo_stderr: IO[str] | None,
) -> tuple[int | None, int | None]:
    """The rank as torchrun starts it, without the recorder: (exit code, signal)."""
    target = ["-m", launch.module] if launch.module else [launch.argv0 or str(launch.script)]
    command = [sys.executable, *launch.python_options, *target, *launch.args]
    process.record["child_command"] = command  # how end_ranks knows it is still this process
    child = subprocess.Popen(
        command,
        cwd=cwd,
        env=child_env(False),  # as the recorded ranks ran: torch.compile off, faulthandler on
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    process.started(child)
    pumps = [
        _tee(child.stdout, folder / f"{attempt}.stdout.txt", echo_stdout, None),
        _tee(child.stderr, folder / f"{attempt}.stderr.txt", echo_stderr, None),
    ]
    code = child.wait()
    for pump in pumps:
        pump.join(timeout=5)
    return (code, None) if code >= 0 else (None, -code)


if __name__ == "__main__":
    main(sys.argv[1])
