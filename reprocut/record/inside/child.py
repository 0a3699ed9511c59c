"""The user's process: `python -m reprocut.record.inside.child CONFIG.json` runs the script
under the recorder.

The script runs as under `python train.py` (or `python -m pkg.train`): same `sys.argv`,
`sys.path[0]`, `__main__`, `__spec__`, working directory and exit code. What the recorder saw is
written to the run directory as `outcome.json` (+ `inputs.pt`) before the process leaves
through `os._exit`: after a sticky CUDA error, teardown can hang, so no destructors and no atexit
run. A failure's outcome is written early too (outcome.py), since teardown can also crash.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from reprocut.check import lifeline
from reprocut.model.case import SourceLocation
from reprocut.model.recording import OUTCOME_FILE, atomic_write
from reprocut.record.inside.main_module import run_main
from reprocut.record.inside.outcome import failure_error, recorded_state
from reprocut.record.inside.pytest_failure import FailedTest

NONFINITE_INPUTS_FILE = "nonfinite-inputs.pt"


def main(config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    run_dir = Path(config["run_dir"])
    script = os.path.abspath(config["script"])
    faulthandler.enable(file=sys.stderr, all_threads=True)
    # reprocut killed by SIGKILL: nothing there ends this group, so it ends itself
    lifeline.end_group_with_parent(config.get("parent_pid"))

    import torch  # after the environment is set: CUDA reads it when it initialises

    from reprocut.check.attribution import settle_cuda
    from reprocut.record.inside.compile_use import CompileUse, inductor_settings
    from reprocut.record.inside.nonfinite import NonfiniteStop
    from reprocut.record.inside.recorder import Recorder, RecorderConfig

    compile_use = CompileUse(torch).__enter__()  # the model runs eagerly: see compile_use

    recorder = Recorder(
        RecorderConfig(
            run_dir=run_dir,
            localize_from=config.get("localize_from"),
            localize_to=config.get("localize_to"),
            snapshots=config.get("snapshots", True),
            # the memory watch sees every op; its backward allocations need forward lines
            light_steps=False if config.get("memory") else config.get("light_steps"),
            tag_backward=config.get("tag_backward", True),
            nan=config.get("nan", False),
        )
    )
    module = config.get("module")
    sys.argv = [config.get("argv0") or script, *config.get("argv", [])]
    sys.path[0] = os.getcwd() if module else os.path.dirname(script)  # as python sets it
    outcome: dict[str, Any] = {"status": "passed", "exit_code": 0}
    exit_code, ended = 0, False
    exit_request: SystemExit | None = None
    stopped = False  # --nan: reprocut ended the run (NonfiniteStop)
    memory = _memory_watch(config, recorder, run_dir)  # below the recorder's own modes
    recorder.__enter__()
    line_sync = _line_sync(config, recorder, script) if config.get("sync_lines") else None
    try:
        try:
            with line_sync or contextlib.nullcontext():
                run_main(script, module, recorder.state)
        except SystemExit as exc:
            exit_request = exc
        except NonfiniteStop:
            stopped = True
        ended = True  # from here on, a fault surfaces at the script's end
        settle_cuda()
        if exit_request is not None:
            code = exit_request.code
            exit_code = code if isinstance(code, int) else (0 if code is None else 1)
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
            outcome = {"status": "exited", "exit_code": exit_code}
        if stopped:
            outcome = {"status": "stopped", "exit_code": 0}
    except BaseException as exc:  # the failure under study: everything is data now
        exit_code = 1
        test = None
        if isinstance(exc, FailedTest):  # pytest ended; its first test failing in a torch op
            test, exit_code, exc = exc.test, exc.exit_code, exc.error
        surfaced = recorder.frames.innermost_in_traceback(exc.__traceback__)
        if line_sync is not None and line_sync.launch is not None:
            surfaced = line_sync.launch  # the line after which the GPU first reported the fault
        elif surfaced is None and ended:
            surfaced = _script_end(script)
        error = failure_error(exc, recorder.state.culprit_error)
        outcome = {
            "status": "failed",
            "exit_code": exit_code,
            "error": error,
            "traceback": user_traceback(exc, error),
            "surfaced_at": _location_json(surfaced),
            "last_op": recorder.state.last_op,
            "loop": recorder.loops.from_traceback(exc.__traceback__),
            "after_loop": recorder.loops.training.after_traceback(exc.__traceback__),
            "interrupted": isinstance(exc, KeyboardInterrupt),
            "failed_at": time.time(),  # under torchrun: which rank failed first
            # in the early outcome too: a process that crashes at teardown (CuPy's module
            # unload after a fault) leaves only that one, and the step must not come from
            # the non-blocking run, where the fault surfaced a step later
            "step": _launch_step(line_sync, recorder.state.step),
        }
        if test is None:
            sys.stderr.write(outcome["traceback"])
        else:  # pytest printed its own report
            outcome["test"] = test
        recorder.note_unwatched_raise(exc)
        recorder.early.write(outcome)  # before closing and teardown, which may crash
        culprit = recorder.state.culprit
        if line_sync is not None and not (culprit and culprit.op and culprit.synchronized):
            line_sync.read_launch(exc)  # no op raised: what reached the custom kernel's launch
        if memory is not None:
            memory.at_failure(exc, f"{error['type']}: {error['message']}")
    finally:
        compile_use.__exit__()
        light_step = recorder.light_step  # read before close(), which turns the modes off
        recorder.close()
        if memory is not None:
            memory.stop()
            memory.write()
    failed = outcome["status"] == "failed"
    outcome.update(recorded_state(recorder.state, light_step, failed=failed))
    if failed:
        outcome["step"] = _launch_step(line_sync, outcome["step"])
    outcome["compiled"] = compile_use.used()
    if outcome["compiled"]:
        outcome["inductor_settings"] = inductor_settings()
        outcome["compiled_calls"] = compile_use.first_calls
    if recorder.flags is not None:
        recorder.flags.flush(recorder.state.step)
        outcome["nonfinite"] = recorder.flags.to_json()
        if recorder.op_watch is not None:
            outcome["nonfinite"].update(recorder.op_watch.to_json())
    if recorder.op_watch is not None:  # the origin's inputs: inputs.pt stays the culprit's
        recorder.store.save(run_dir / NONFINITE_INPUTS_FILE)
    elif outcome["status"] == "failed":
        recorder.store.save(run_dir / "inputs.pt")
    atomic_write(run_dir / OUTCOME_FILE, json.dumps(outcome, indent=1, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _line_sync(config: dict[str, Any], recorder: Any, script: str) -> Any:
    """The blocking rerun's tracer: it waits for the GPU in the steps being localized and reads
    what reaches the launch that faults (see line_sync)."""
    from reprocut.model.recording import LAUNCH_PROBE_FILE
    from reprocut.record.inside.launch_read import LaunchReader
    from reprocut.record.inside.line_sync import LineSync

    reader = LaunchReader(Path(config["run_dir"]) / LAUNCH_PROBE_FILE, script,
                          list(config.get("argv", [])))  # fmt: skip
    window = (config.get("localize_from"), config.get("localize_to"))
    return LineSync(step=lambda: recorder.state.step, window=window, reader=reader)


def _memory_watch(config: dict[str, Any], recorder: Any, run_dir: Path) -> Any:
    """`record --memory` or an out-of-memory rerun: every storage's maker, memory per step."""
    if not config.get("memory"):
        return None
    from reprocut.record.inside.memory import MemoryWatch

    watch = MemoryWatch(recorder.state, recorder.frames, run_dir, cuda_history=True).start()
    recorder.step_listeners.append(watch.end_step)
    return watch


def _script_end(script: str) -> SourceLocation:
    """Where a fault that surfaced only when the script had ended is reported."""
    try:
        last = len(Path(script).read_text().splitlines())
    except OSError:
        last = 0
    return SourceLocation(
        script, last, "(end of script: the fault surfaced when reprocut waited for the GPU)"
    )


def user_traceback(exc: BaseException, error: dict[str, Any] | None = None) -> str:
    """The traceback as `python script.py` would print it: reprocut's own frames left out;
    and, where PyTorch lost the op's error on the way, what the op raised."""
    from reprocut.record.inside.frames import plain_python_frames

    frames = plain_python_frames(list(traceback.extract_tb(exc.__traceback__)))
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines.extend(traceback.format_exception_only(type(exc), exc))
    if error is not None and "surfaced_as" in error:
        lines.append(
            "reprocut: PyTorch lost the op's error on its way to the script; the op raised "
            f"{error['type']}: {error['message']}\n"
        )
    return "".join(lines)


def _location_json(location: Any) -> dict[str, Any] | None:
    return None if location is None else location.to_json()


def _launch_step(line_sync: Any, step: int | None) -> int | None:
    """The step that launched the faulting kernel, when the line sync saw its launch."""
    if line_sync is not None and line_sync.launch_step is not None:
        return line_sync.launch_step
    return step


if __name__ == "__main__":
    main(sys.argv[1])
