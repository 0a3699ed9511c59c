"""An out-of-memory failure as the memory watch takes it, each stage within its time budget.

Taken inside the op whose allocation failed (memory.py's dispatch mode sees it raise), before
the error unwinds: then the allocator's allocated and reserved bytes are the figures the error
itself gives, and the holders are what was live, backward's gradients in flight and a
checkpoint's recomputed activations included (on the H200, 110.66 GiB allocated when the
softmax backward failed, 2.2 GB once the error had reached the script). What it holds: the
step, the phase (forward, backward, optimizer, or the recompute of a checkpointed block, named
by the block's function and line), the op and its lines, the allocator's and the device's
figures, the holders by role and line (retainers.py), and on CUDA the allocator snapshot.
The walk has WALK_SECONDS, the snapshot SNAPSHOT_SECONDS; a stage that runs out is listed under
`skipped` with its reason, and the rest is written all the same.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Protocol

import torch

from reprocut.model.budget import Deadline, call_within
from reprocut.model.oom import library_blocks, snapshot_free_blocks
from reprocut.record.inside.frames import UserFrames
from reprocut.record.inside.retainers import analyse
from reprocut.record.inside.where import autograd_tag

SNAPSHOT_FILE = "memory_snapshot.pickle"
WALK_SECONDS = 8.0  # the gc pass, the graph walks and the search for the retaining variable
SNAPSHOT_SECONDS = 12.0  # the allocator snapshot (its stacks symbolized) and its pickle
_CHECKPOINT_FILE = os.path.join("torch", "utils", "checkpoint.py")


class Watch(Protocol):
    """What a capture reads of the memory watch (memory.py's MemoryWatch)."""

    state: Any  # RunState
    frames: UserFrames
    live: dict[int, Any]
    run_dir: Path
    cuda_history: bool

    def prune(self) -> None: ...
    def figures(self) -> tuple[int, int]: ...
    def carried_bytes(self, step: int) -> int: ...


def stack_from(frame: FrameType | None) -> list[FrameType]:
    """Frames from `frame` outward, innermost first. Off the main thread (autograd's engine
    runs a GPU backward on threads of its own) the main thread's frames follow: the user's
    variables live there."""
    stack: list[FrameType] = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    main = threading.main_thread()
    if threading.current_thread() is not main and main.ident is not None:
        outer = sys._current_frames().get(main.ident)
        while outer is not None:
            stack.append(outer)
            outer = outer.f_back
    return stack


def traceback_frames(tb: TracebackType | None) -> list[FrameType]:
    """A traceback's frames, innermost first."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def in_checkpoint(frame: FrameType | None) -> bool:
    """Whether torch.utils.checkpoint is running on this thread's stack (its recompute)."""
    while frame is not None:
        if frame.f_code.co_filename.endswith(_CHECKPOINT_FILE):
            return True
        frame = frame.f_back
    return False


def checkpoint_block(frames: UserFrames, stack: list[FrameType]) -> dict[str, Any] | None:
    """The checkpointed function a recompute is running: the outermost user frame inside
    torch.utils.checkpoint's own (its `recompute_fn`, or CheckpointFunction.backward)."""
    user = None
    for frame in stack:
        if frame.f_code.co_filename.endswith(_CHECKPOINT_FILE):
            if user is None:
                return None
            code = user.f_code
            name = getattr(code, "co_qualname", code.co_name)
            return {"file": code.co_filename, "line": code.co_firstlineno, "function": name}
        if frames.is_user(frame.f_code):
            user = frame
    return None


def _pair(location: Any) -> list[Any] | None:
    return None if location is None else [location.file, location.line]


def capture_failure(
    watch: Watch,
    op: str | None,
    error: str,
    phase: str,
    frame: FrameType | None,
    *,
    tb: TracebackType | None = None,
) -> dict[str, Any]:
    """memory.json's `failure`: taken at `frame` (inside the failing op), or from the
    traceback `tb` once the error reached the script."""
    started = time.monotonic()
    stack = stack_from(frame) if frame is not None else traceback_frames(tb)
    watch.prune()
    step = watch.state.step
    allocated, reserved = watch.figures()
    tag = autograd_tag() if frame is not None else None
    record: dict[str, Any] = {
        "step": step,
        "allocated": allocated,
        "reserved": reserved,
        "carried": watch.carried_bytes(step),
        "error": error,
        "op": op,
        "phase": phase,
        "source": _pair(watch.frames.find(stack[0] if stack else None)),
        "forward_source": _pair(tag[0]) if tag else None,
        "module": (tag[1] if tag else None) or next(iter(watch.state.module_stack[-1:]), None),
        "taken": "where the allocation failed" if frame is not None else "after the error",
    }
    if phase == "recompute":
        record["recompute"] = checkpoint_block(watch.frames, stack)
    deadline = Deadline(WALK_SECONDS)
    record.update(analyse(watch.live, watch.frames, stack, step, deadline, at_failure=True))
    walked = deadline.spent()
    tracked = {a.ptr for a in watch.live.values()}
    state = cuda_state(watch.run_dir, watch.cuda_history, tracked)
    record["skipped"] = [*record.get("skipped", ()), *state.pop("skipped", ())]
    workspaces = state.pop("library_bytes", 0)
    if workspaces:
        record["roles"]["library workspaces"] = workspaces
    snapshot_seconds = state.pop("snapshot_seconds", 0.0)
    record.update(state)
    record["seconds"] = {
        "walk": round(walked, 3),
        "snapshot": snapshot_seconds,
        "capture": round(time.monotonic() - started, 3),
    }
    return record


def cuda_state(run_dir: Path, history: bool, tracked: set[int]) -> dict[str, Any]:
    """The device's free and total memory, the allocator's largest free cached block, the
    bytes of library workspaces among the blocks no op made (`tracked`: the ops' data
    pointers), and the allocator snapshot (for pytorch.org/memory_viz) where its history was
    recorded: one snapshot, its stacks symbolized once, serves all three. The snapshot gets
    SNAPSHOT_SECONDS: with a long history its stacks can take minutes to symbolize."""
    if not torch.cuda.is_initialized():
        return {}
    state: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        free, total = torch.cuda.mem_get_info()
        state.update(device_free=free, device_total=total)
    cancelled = threading.Event()

    def read() -> dict[str, Any]:
        snapshot = torch.cuda.memory._snapshot()
        largest, expandable = snapshot_free_blocks(snapshot["segments"])
        found: dict[str, Any] = {
            "largest_free_block": largest,
            "expandable_segments": expandable,
            "library_bytes": library_blocks(snapshot["segments"], tracked),
        }
        if history and not cancelled.is_set():
            part = run_dir / f"{SNAPSHOT_FILE}.part"
            with part.open("wb") as sink:  # as _dump_snapshot writes it
                pickle.dump(snapshot, sink)
            if not cancelled.is_set():
                part.replace(run_dir / SNAPSHOT_FILE)
                found["snapshot"] = SNAPSHOT_FILE
        return found

    done = call_within(SNAPSHOT_SECONDS, read)
    if done.value is not None:
        state.update(done.value)
    else:
        cancelled.set()
        state["skipped"] = [{"stage": "the allocator snapshot", "reason": done.skipped}]
    state["snapshot_seconds"] = round(done.seconds, 3)
    return state
