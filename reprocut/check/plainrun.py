"""A candidate run the way the user will run it: a fresh `python`, no reprocut code around it.

The fork server's children differ from `python repro.py` in ways no environment variable fixes:
they share the server's memory copy-on-write, and run under attribution modes. So the oracle
confirms some accepted candidates in a plain process (`reprocut.check.agreement` says which).
To keep that cheap, the next process is started ahead and waits: a fresh interpreter that has
imported torch (CUDA untouched; the verification's also import what the repro imports next,
`warm_modules`) and then reads the path of the script to run. The
script runs as `__main__` the way `python script` runs it (its folder, arguments, sys.path[0],
__file__), and its exception is printed by the interpreter itself, as under `python repro.py`;
the signature is read back from stderr like a verification run's.

Importing torch ahead changes nothing a script sees when importing torch is the first thing it
does (`starts_by_importing_torch`). A script that sets the environment first (CUDA reads it
when torch starts it) or imports something else first is not the same run in such an
interpreter: the verification runs it in a fresh `python` (reprocut.pipeline.ahead). A plain
confirmation (`PlainRunner`) runs a candidate that may set the environment in a fresh one.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from reprocut.check.childenv import SETS_ENVIRONMENT
from reprocut.check.oracle import run_with_timeout
from reprocut.check.preload import uses_dynamo
from reprocut.check.verify import RunOutcome, run_plain, signature_from_stderr

# what an interpreter started ahead does first (reprocut.check.memcheck_process's as well):
# import torch, then read the script to run from stdin (EOF: never handed one, end at once) and
# take its folder, arguments and sys.path[0] as `python script args...` has them
STANDBY_REQUEST = r"""
import json, os, sys
import torch  # the script's own first statement (starts_by_importing_torch), done ahead
for _name in sys.argv[1:]:  # what the script imports next, or uses torch._dynamo for (warm)
    __import__(_name)
line = sys.stdin.readline()
if not line:
    os._exit(0)
request = json.loads(line)
os.chdir(request["cwd"])
script = os.path.abspath(request["filename"])
sys.argv = [request["filename"], *request["argv"]]
sys.path[0] = os.path.dirname(script)
"""

# then runs the script as `python script` does: in a fresh __main__ module, __file__ absolute
# (as since Python 3.9) and sys.argv[0] as given (runpy would make both the same path)
_STANDBY = (
    "import builtins, importlib.machinery, types\n"
    + STANDBY_REQUEST
    + r"""
with open(script, "rb") as source:
    code = compile(source.read(), script, "exec")
main = types.ModuleType("__main__")
main.__dict__.update(__file__=script, __cached__=None, __builtins__=builtins,
                     __loader__=importlib.machinery.SourceFileLoader("__main__", script))
sys.modules["__main__"] = main
exec(code, main.__dict__)
"""
)


def starts_by_importing_torch(code: str) -> bool:
    """Is the script's first statement (after its docstring) exactly `import torch`? Then an
    interpreter that imported torch before it was handed the script runs it as `python script`
    would: the script's first act is done, nothing before it could have changed how. Exact on
    purpose: `import torch.nn`, `from torch import nn`, `import torch as t` or `import os`
    first (an environment variable set before torch starts CUDA) do not qualify."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):
        return False
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        body = body[1:] if isinstance(first.value.value, str) else body  # the module's docstring
    if not body or not isinstance(body[0], ast.Import):
        return False
    (alias, *others) = body[0].names
    return not others and alias.name == "torch" and alias.asname is None


# modules an interpreter started ahead may import after torch, where the script imports them
# at its top (the fork server's trusted preloads): on the H200 a plain run of a triton_op's
# repro took 8.4-9.3 s with torch imported ahead, torch._dynamo's import (first use of the op)
# the most of it, as it was the most of the fork server's preload (6 s)
WARMABLE = ("numpy", "cupy", "triton", "triton.language")
DYNAMO = "torch._dynamo"


def warm_modules(code: str) -> tuple[str, ...]:
    """What an interpreter may import ahead of `code`, after torch: the WARMABLE modules its
    top level imports, and torch._dynamo where it uses a part of torch that imports it on first
    use (reprocut.check.preload.uses_dynamo); nothing for code that may write the environment
    (torch._dynamo and the kernel libraries read it as they start)."""
    if SETS_ENVIRONMENT.search(code) is not None:
        return ()
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):
        return ()
    imported = {a.name for s in body if isinstance(s, ast.Import) for a in s.names}
    found = [name for name in WARMABLE if name in imported]
    return (*found, DYNAMO) if uses_dynamo(code) else tuple(found)


def runs_warm(code: str, warm: Sequence[str]) -> bool:
    """Is running `code` in an interpreter that imported torch, then `warm`, running `python
    code`? Its first act is `import torch` and it imports each of `warm` itself (or, for
    torch._dynamo, uses what imports it), writing no environment before."""
    return starts_by_importing_torch(code) and set(warm) <= set(warm_modules(code))


class _Standby:
    """One waiting interpreter and the file its stderr goes to."""

    def __init__(
        self,
        directory: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        warm: Sequence[str] = (),
    ) -> None:
        """`cwd`: where it starts (the folder of the scripts it will run: `import torch` then
        looks where `python script` looks first; default: this process's); `warm`: modules it
        imports after torch (`warm_modules` of the scripts it may run)."""
        handle, name = tempfile.mkstemp(prefix="plain-", suffix=".err", dir=directory)
        self.stderr_path = Path(name)
        with os.fdopen(handle, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _STANDBY, *warm],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,  # None: this process's, as `python repro.py` has it
                cwd=cwd,
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


def has_cores_to_warm() -> bool:
    """Enough cores to import torch in processes started ahead, beside the fork server."""
    return (os.cpu_count() or 1) >= WARM_CORES


class Standbys:
    """`count` interpreters started now, for one verification later (reprocut.check.verify):
    they import torch while the shrink runs. Those not handed out are ended by `close`.

    On the H200 a plain run of a repro took ~4.25 s, ~4.1 s of it importing torch (and CuPy)
    and making the CUDA context: the verification's runs, started ahead, save the import."""

    def __init__(
        self,
        count: int,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        warm: Sequence[str] = (),
    ) -> None:
        """`cwd`: the folder of the script they will run, `warm`: what they import after torch
        (see _Standby)."""
        self.count, self._env, self._cwd, self.warm = count, env, cwd, tuple(warm)
        self._tmp = tempfile.TemporaryDirectory(prefix="reprocut-verify-")
        self._waiting = [self._start() for _ in range(count)]
        self._closed = False

    def _start(self) -> _Standby:
        return _Standby(Path(self._tmp.name), self._env, self._cwd, self.warm)

    @classmethod
    def if_worth_it(
        cls, count: int, cwd: Path | None = None, warm: Sequence[str] = ()
    ) -> Standbys | None:
        """Started where the machine has the cores to import torch beside the fork server."""
        if count < 2 or not has_cores_to_warm():
            return None
        return cls(count, cwd=cwd, warm=warm)

    def fit(self, code: str) -> bool:
        """Do these interpreters run `code` as `python` would (`runs_warm`)?"""
        return runs_warm(code, self.warm)

    def take(self) -> list[_Standby]:
        """The waiting interpreters, each to run one script (handed out once)."""
        taken, self._waiting = self._waiting, []
        return taken

    def refill(self) -> None:
        """Start interpreters until `count` wait again (after a `take` whose runs were not the
        verification's: reprocut.pipeline.verify_ahead)."""
        if self._closed:
            return
        while len(self._waiting) < self.count:
            self._waiting.append(self._start())

    def close(self) -> None:
        self._closed = True
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
        """`python script argv...` from `cwd` (the script's folder by default): in the waiting
        interpreter, unless the script may set the environment (a user's script, cut down, can
        set what torch's import or CUDA's start reads before it imports torch): then in a
        fresh one."""
        script = Path(script).resolve()
        folder = Path(cwd or script.parent)
        try:
            same_run = SETS_ENVIRONMENT.search(script.read_text()) is None
        except OSError:
            same_run = False
        if same_run:
            self.warm_up()
            standby, self._standby = self._standby, None
            assert standby is not None
            outcome = standby.run(script, argv, folder, timeout)
        else:
            outcome = run_plain(script, argv=argv, timeout=timeout, env=self._env, cwd=folder)
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
