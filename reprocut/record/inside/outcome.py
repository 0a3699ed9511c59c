"""outcome.json written the moment the failure is known, before teardown can kill the process.

After an asynchronous CUDA fault a process can die after its own code saw the error and before
child.py's last lines run: a gloo worker copying CUDA tensors to the host, a deleter recording
an event on the broken context, `destroy_process_group`, atexit, each can abort or segfault it
(on the H200 a torchrun rank died by SIGSEGV, or SIGABRT, before it wrote its outcome, and its
snapshots were lost with it). So the outcome, with the culprit, the snapshots and inputs.pt, is
written early, marked `"early": true`, and child.py's final outcome overwrites it:
- when the recorder notes the culprit (an op raised with all earlier work complete: ops.py,
  calls.py), in the thread the op ran in, before the exception leaves the op;
- when the exception reaches child.py, before the recorder closes and the process tears down.
Nothing here calls CUDA: host copies only, saved as `TensorStore.save` saves them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import TYPE_CHECKING, Any

from reprocut.model.recording import INPUTS_FILE, atomic_write
from reprocut.record.inside.frameworks import imported_frameworks

if TYPE_CHECKING:
    from reprocut.record.inside.recorder import Recorder

OUTCOME_FILE = "outcome.json"
_MAIN_PID = os.getpid()  # a forked DataLoader worker inherits this: its culprits are not written


def error_json(exc: BaseException) -> dict[str, Any]:
    code = getattr(exc, "error_code", None)
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "code": code if isinstance(code, int) else None,
    }


def recorded_state(recorder: Recorder, light_step: bool, *, failed: bool) -> dict[str, Any]:
    """What the recorder holds for the outcome: where the script was, its culprit, snapshots."""
    return {
        "step": recorder.state.step,
        "light_step": light_step,  # only asserting ops seen: no in-process culprit
        "phase": recorder.state.phase() if failed else None,
        "frameworks": imported_frameworks(),
        "culprit": None if recorder.culprit is None else recorder.culprit.to_json(),
        "snapshots": [s.to_json() for s in recorder.all_snapshots()],
        "healthy_through": recorder.healthy_through,
    }


def report_early(recorder: Recorder, error: BaseException | None) -> None:
    """The recorder just noted its culprit while `error` is being handled: write the outcome."""
    if error is None or os.getpid() != _MAIN_PID:
        return
    write_early(
        recorder,
        {
            "status": "failed",
            "exit_code": 1,
            "error": error_json(error),
            "traceback": "",
            "surfaced_at": None,
            "last_op": recorder.last_op,
            "loop": {},
            "interrupted": False,
            "failed_at": time.time(),  # under torchrun: which rank failed first
        },
    )


def write_early(recorder: Recorder, outcome: dict[str, Any]) -> None:
    """inputs.pt, then outcome.json, as the recorder holds them now; best effort (the final
    outcome follows if the process lives). `--nan` runs keep their own order of writes."""
    if recorder.flags is not None or recorder.op_watch is not None:
        return
    import torch

    run_dir = recorder.config.run_dir
    with contextlib.suppress(Exception):
        # the copies and the save are reprocut's, not the script's ops: no mode sees them
        with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
            state = recorded_state(recorder, recorder.light_step, failed=True)
            recorder.store.save(run_dir / INPUTS_FILE)
        text = json.dumps({**outcome, **state, "early": True}, indent=1, default=str)
        atomic_write(run_dir / OUTCOME_FILE, text)
