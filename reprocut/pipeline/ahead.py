"""The verification's processes, started as the shrink starts: they import torch while it runs.

On the H200, with four shrinks at once, the verification took 6.6-10.5 s for script repros: a
plain `python repro.py` took ~4.25 s alone, ~4.1 s of it importing torch and CuPy and making the
CUDA context, and a memory fault's memcheck of repro.py (~5.5 s alone, most of it the same
imports under the sanitizer) ended 0.7-2.1 s after the plain runs. So both wait ready: the plain
runs' interpreters (check/plainrun.Standbys) and, for a memory fault on the GPU, one memcheck
(check/memcheck_process.MemcheckStandby). Both are used only if repro.py's first statement is
`import torch` (check/plainrun.starts_by_importing_torch), and the plain runs' interpreters,
which also import what the repro is expected to import next (its kernel libraries, and
torch._dynamo for a custom op's registration: check/plainrun.warm_modules), only if it imports
all of that itself, writing no environment: so that the imports done ahead change nothing it
sees; else the runs are fresh as before, and what waited is ended. Whatever is left
ends with the shrink, however it ends (the shrink's ExitStack).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reprocut.check.memcheck_process import MemcheckStandby
from reprocut.check.plainrun import Standbys, has_cores_to_warm, warm_modules
from reprocut.check.sanitizer import find_sanitizer
from reprocut.check.verify import Standby
from reprocut.model.recording import Failure
from reprocut.model.signature import is_memory_error
from reprocut.pipeline.cases import definitions_code


@dataclass(frozen=True, slots=True)
class Ahead:
    """What was started for the verification (None: nothing of that kind)."""

    plain: Standbys | None = None
    memcheck: MemcheckStandby | None = None

    def standbys_for(self, repro: Path) -> Sequence[Standby]:
        """The plain runs' interpreters, if running repro.py in one is running `python
        repro.py`: its first statement is `import torch`, and it imports what they imported
        after it (check/plainrun.runs_warm). Else they end now and the runs are
        plain: a user's script, reduced, may set the environment CUDA reads before importing
        torch, and so does a captured call's repro that needs an environment variable."""
        if self.plain is None:
            return ()
        if self.plain.fit(repro.read_text()):
            return self.plain.take()
        self.plain.close()
        return ()


def start_ahead(
    failure: Failure,
    runs: int,
    out: Path,
    cleanup: contextlib.ExitStack,
    warm: Sequence[str] = (),
) -> Ahead:
    """Start the verification's processes in `out`, repro.py's folder (where `import torch`
    then looks first, as `python repro.py` does), where the machine has the cores to import
    torch beside the fork server; `cleanup` ends them with the shrink. `warm`: what the plain
    runs' interpreters import after torch (check/plainrun.warm_modules of what the repro is
    expected to be; a repro that does not import them all runs fresh)."""
    plain = Standbys.if_worth_it(runs, cwd=out, warm=warm)
    memcheck = warm_memcheck(failure, out)
    for started in (plain, memcheck):
        if started is not None:
            cleanup.enter_context(contextlib.closing(started))
    return Ahead(plain, memcheck)


# Off unless set to 1: on the H200 (four shrinks at once, 86705e3) three of the six memchecks
# started ahead that were handed a repro.py ran to their 180 s timeout, where a fresh one
# found the fault in 6-8 s, and an op-level shrink beside them saw every check time out; the
# other three took 3.0-6.3 s. The cause is not known yet.
MEMCHECK_AHEAD_ENV = "REPROCUT_MEMCHECK_AHEAD"


def warm_memcheck(failure: Failure, out: Path) -> MemcheckStandby | None:
    """The repro's memcheck started now (None: not asked for by REPROCUT_MEMCHECK_AHEAD=1, not a
    memory fault on the GPU, no compute-sanitizer, or too few cores), filtering the kernels
    run_memcheck will filter."""
    if os.environ.get(MEMCHECK_AHEAD_ENV) != "1":
        return None
    if not (is_memory_error(failure.signature) and failure.device.startswith("cuda")):
        return None
    exe = find_sanitizer()
    if exe is None or not has_cores_to_warm():
        return None
    return MemcheckStandby.start(exe, kernel=failure.kernel, cwd=out)


# what a script's reduction keeps importing, as far as can be told before it: the library of a
# custom kernel that fails (numpy or an optimizer's torch._dynamo usually go with the training)
KERNEL_LIBRARIES = ("cupy", "triton", "triton.language")


def warm_for(failure: Failure, defined: Failure | None) -> tuple[str, ...]:
    """What the verification's interpreters import after torch: what the repro will import,
    as far as it can be known before the shrink (a custom op's definitions', torch._dynamo for
    its registration; a script's kernel libraries). A repro that does not import all of it
    runs in fresh interpreters instead (check/plainrun.runs_warm). `defined`: the failure with
    its cases' definitions (None: a script reduction)."""
    if defined is not None:
        return warm_modules(definitions_code(defined))
    script = Path(failure.script) if failure.script else None
    try:
        imported = warm_modules(script.read_text()) if script is not None else ()
    except OSError:
        return ()
    return tuple(name for name in imported if name in KERNEL_LIBRARIES)
