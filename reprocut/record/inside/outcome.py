"""outcome.json written the moment the failure is known, before teardown can kill the process.

After an asynchronous CUDA fault a process can die after its own code saw the error and before
child.py's last lines run: a gloo worker copying CUDA tensors to the host, a deleter recording
an event on the broken context, `destroy_process_group`, atexit, each can abort or segfault it
(on the H200 a torchrun rank died by SIGSEGV, or SIGABRT, before it wrote its outcome, and its
snapshots were lost with it). So the outcome, with the culprit, the snapshots and inputs.pt, is
written early, marked `"early": true`, and child.py's final outcome overwrites it:
- when the hooks note the culprit (an op raised with all earlier work complete: ops.py,
  calls.py, through `EarlyOutcome.note_culprit`, which the recorder hands them), in the thread
  the op ran in, before the exception leaves the op;
- when the exception reaches child.py, before the recorder closes and the process tears down.
Nothing here calls CUDA: host copies only, saved as `TensorStore.save` saves them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from reprocut.model.recording import INPUTS_FILE, OUTCOME_FILE, atomic_write
from reprocut.record.inside.capture import TensorStore
from reprocut.record.inside.frameworks import imported_frameworks
from reprocut.record.inside.records import Culprit
from reprocut.record.inside.state import RunState

_MAIN_PID = os.getpid()  # a forked DataLoader worker inherits this: its culprits are not written


def error_json(exc: BaseException) -> dict[str, Any]:
    code = getattr(exc, "error_code", None)
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "code": code if isinstance(code, int) else None,
    }


# what CPython says when a C function failed but the exception was lost before it returned: on
# the H200 an out-of-memory error in backward, raised through reprocut's dispatch mode on the
# autograd engine's CUDA thread, reached the script as this (while recording the allocator's
# history); a plain run of the same script raised torch.OutOfMemoryError
_LOST = "returned NULL without setting an exception"


def error_lost_on_the_way(exc: BaseException) -> bool:
    """`exc` says only that some error was lost on its way to Python."""
    return isinstance(exc, SystemError) and _LOST in str(exc)


def failure_error(exc: BaseException, culprit_error: dict[str, Any] | None) -> dict[str, Any]:
    """The run's error: `exc`, or the culprit op's own where PyTorch lost it on the way (then
    `surfaced_as` keeps what the script saw)."""
    if culprit_error is None or not error_lost_on_the_way(exc):
        return error_json(exc)
    return {**culprit_error, "surfaced_as": error_json(exc)}


def recorded_state(state: RunState, light_step: bool, *, failed: bool) -> dict[str, Any]:
    """What the recorder holds for the outcome: where the script was, its culprit, snapshots."""
    return {
        "step": state.step,
        "light_step": light_step,  # only asserting ops seen: no in-process culprit
        # a CPU light step: the call that raised was watched again (raise_watch.py), unless
        # it could not be (then only a rerun of the step names the op)
        "raise_watched": light_step and state.raise_watched,
        "raise_missed": state.raise_missed,
        "phase": state.phase() if failed else None,
        "frameworks": imported_frameworks(),
        "culprit": None if state.culprit is None else state.culprit.to_json(),
        "snapshots": [s.to_json() for s in state.all_snapshots()],
        "healthy_through": state.healthy_through,
    }


class EarlyOutcome:
    """Writes the run's outcome as it stands, the moment a failure is known. `--nan` runs
    (`enabled` False) keep their own order of writes."""

    def __init__(self, state: RunState, store: TensorStore, run_dir: Path, *, enabled: bool):
        self.state = state
        self.store = store
        self.run_dir = run_dir
        self.enabled = enabled

    def note_culprit(self, culprit: Culprit) -> None:
        """The first culprit is the run's; its outcome is written at once (called while its
        error is being handled)."""
        if self.state.culprit is None:
            self.state.culprit = culprit
            error = sys.exc_info()[1]
            if error is not None:
                self.state.culprit_error = error_json(error)
                self.report(self.state.culprit_error)

    def report(self, error: dict[str, Any]) -> None:
        """The culprit was just noted while `error` ({type, message, code}) is being handled:
        write the outcome."""
        if os.getpid() != _MAIN_PID:
            return
        self.write(
            {
                "status": "failed",
                "exit_code": 1,
                "error": error,
                "traceback": "",
                "surfaced_at": None,
                "last_op": self.state.last_op,
                "loop": {},
                "interrupted": False,
                "failed_at": time.time(),  # under torchrun: which rank failed first
            }
        )

    def write(self, outcome: dict[str, Any]) -> None:
        """inputs.pt, then outcome.json, as the run holds them now; best effort (the final
        outcome follows if the process lives)."""
        if not self.enabled:
            return
        import torch

        with contextlib.suppress(Exception):
            # the copies and the save are reprocut's, not the script's ops: no mode sees them
            with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
                state = recorded_state(self.state, self.state.light_step, failed=True)
                self.store.save(self.run_dir / INPUTS_FILE)
            text = json.dumps({**outcome, **state, "early": True}, indent=1, default=str)
            atomic_write(self.run_dir / OUTCOME_FILE, text)
