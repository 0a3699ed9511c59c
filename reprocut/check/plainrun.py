"""A candidate run the way the user will run it: a fresh `python`, no reprocut code around it.

The fork server's children differ from `python repro.py` in ways no environment variable fixes:
they share the server's memory copy-on-write, and run under attribution modes. So the oracle
confirms some accepted candidates in a plain process (`reprocut.check.agreement` says which).
To keep that cheap, the next process is started ahead and waits: a fresh interpreter that has
imported torch (nothing else; CUDA untouched) and then reads the path of the script to run. The
script runs as `__main__` through runpy and its exception is printed by the interpreter itself,
as under `python repro.py`; the signature is read back from stderr like a verification run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from reprocut.check.oracle import run_with_timeout
from reprocut.check.verify import RunOutcome, signature_from_stderr

_STANDBY = r"""
import json, os, runpy, sys
import torch  # every candidate imports it first; importing it ahead changes nothing it sees
line = sys.stdin.readline()
if not line:
    os._exit(0)
request = json.loads(line)
os.chdir(request["cwd"])
sys.argv = [request["filename"], *request["argv"]]
sys.path[0] = os.path.dirname(os.path.abspath(request["filename"]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class _Standby:
    """One waiting interpreter and the file its stderr goes to."""

    def __init__(self, directory: Path, env: dict[str, str] | None = None) -> None:
        handle, name = tempfile.mkstemp(prefix="plain-", suffix=".err", dir=directory)
        self.stderr_path = Path(name)
        with os.fdopen(handle, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _STANDBY],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,  # None: this process's, as `python repro.py` has it
                start_new_session=True,
                text=True,
            )

    def run(self, script: Path, argv: Sequence[str], cwd: Path, timeout: float) -> RunOutcome:
        started = time.perf_counter()
        request = {"filename": str(script), "argv": list(argv), "cwd": str(cwd)}
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.close()
        returncode = run_with_timeout(self.process, timeout)
        stderr = self.stderr_path.read_text(errors="replace")
        self.stderr_path.unlink(missing_ok=True)
        return RunOutcome(
            returncode, signature_from_stderr(stderr), time.perf_counter() - started, stderr[-4000:]
        )

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin:
                self.process.stdin.close()
        run_with_timeout(self.process, 0)
        self.stderr_path.unlink(missing_ok=True)


# cores for the fork server, reprocut and the verification's interpreters importing torch side
# by side: with 2 (CI) the imports slowed the fork server by as much as they saved
WARM_CORES = 8


class Standbys:
    """`count` interpreters started now, for one verification later (reprocut.check.verify):
    they import torch while the shrink runs. Those not handed out are ended by `close`."""

    def __init__(self, count: int, env: dict[str, str] | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="reprocut-verify-")
        self._waiting = [_Standby(Path(self._tmp.name), env) for _ in range(count)]

    @classmethod
    def if_worth_it(cls, count: int) -> Standbys | None:
        """Started where the machine has the cores to import torch beside the fork server."""
        if count < 2 or (os.cpu_count() or 1) < WARM_CORES:
            return None
        return cls(count)

    def take(self) -> list[_Standby]:
        """The waiting interpreters, each to run one script (handed out once)."""
        taken, self._waiting = self._waiting, []
        return taken

    def close(self) -> None:
        for standby in self._waiting:
            standby.discard()
        self._waiting = []
        self._tmp.cleanup()


class PlainRunner:
    """Plain runs of scripts, each in a fresh interpreter started one run ahead."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        """`env`: the processes' environment (default: this one's, as the user's shell has it)."""
        self._env = env
        self._tmp = tempfile.TemporaryDirectory(prefix="reprocut-plain-")
        self._standby: _Standby | None = None
        self.runs = 0
        self.seconds = 0.0

    def warm_up(self) -> None:
        """Start the next interpreter now (it imports torch while the caller works)."""
        if self._standby is None:
            self._standby = _Standby(Path(self._tmp.name), self._env)

    def run(
        self, script: Path, *, argv: Sequence[str] = (), cwd: Path | None = None,
        timeout: float = 120.0,
    ) -> RunOutcome:  # fmt: skip
        """`python script argv...` from `cwd` (the script's folder by default)."""
        self.warm_up()
        standby, self._standby = self._standby, None
        assert standby is not None
        outcome = standby.run(
            Path(script).resolve(), argv, Path(cwd or Path(script).parent), timeout
        )
        self.runs += 1
        self.seconds += outcome.seconds
        self.warm_up()  # the next one imports torch while this verdict is used
        return outcome

    def close(self) -> None:
        if self._standby is not None:
            self._standby.discard()
            self._standby = None
        self._tmp.cleanup()

    def __enter__(self) -> PlainRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
