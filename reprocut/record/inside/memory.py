"""Inside the user's process (`record --memory`, and the rerun of an out-of-memory failure):
which op and line made each live storage, and how much memory each step ends with.

A dispatch mode below the recorder's own sees every op's outputs and keeps a weak reference to
each new storage with its size, step, op, line and module; a storage that dies drops out when a
step ends. That costs a Python call per op, so it never runs in the normal record path: only
when asked (`--memory`) or in the rerun to a failing step. At each step's end the live bytes
(on CUDA the allocator's allocated and reserved bytes) are kept; when memory carried over from
earlier steps keeps growing, and at the failure, `retainers.py` walks from the user's variables
to the surviving tensors. Everything is written to memory.json in the run folder.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from reprocut.model.oom import library_blocks, snapshot_free_blocks
from reprocut.model.recording import atomic_write
from reprocut.record.inside.frames import UserFrames
from reprocut.record.inside.state import RunState
from reprocut.record.inside.where import autograd_tag

MEMORY_FILE = "memory.json"
SNAPSHOT_FILE = "memory_snapshot.pickle"
_HISTORY_ENTRIES = 200_000  # allocator events kept for the snapshot (CUDA reruns only)


@dataclass(slots=True)
class Allocation:
    """A storage some op made, kept by weak reference."""

    ref: Any  # StorageWeakRef
    ptr: int  # its data pointer: the allocator snapshot's block address
    nbytes: int
    step: int
    phase: str  # "forward", "backward", "optimizer", "other"
    op: str
    line: tuple[str, int] | None
    module: str | None


class MemoryWatch(TorchDispatchMode):
    """Every new storage with its maker; memory per step; the analyses, to memory.json."""

    def __init__(self, state: RunState, frames: UserFrames, run_dir: Path, *, cuda_history: bool):
        super().__init__()
        self.state = state
        self.frames = frames
        self.run_dir = run_dir
        self.live: dict[int, Allocation] = {}
        self.steps: list[list[int]] = []  # [step, allocated, reserved, carried]
        self.analysis: dict[str, Any] | None = None  # the latest walk from the user's variables
        self.failure: dict[str, Any] | None = None
        self._next_walk = 3
        self._cuda_history = cuda_history
        self._names: dict[int, str] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **kwargs) if kwargs else func(*args)
        if isinstance(result, torch.Tensor):
            self._note(func, result)
        elif isinstance(result, (tuple, list)):
            for item in result:
                if isinstance(item, torch.Tensor):
                    self._note(func, item)
        return result

    def _note(self, func: Any, tensor: torch.Tensor) -> None:
        if tensor.layout is not torch.strided or tensor.is_meta:
            return
        try:
            storage = tensor.untyped_storage()
        except Exception:  # tensor subclasses without storage
            return
        key = storage._cdata
        known = self.live.get(key)
        if known is not None and not known.ref.expired():
            return
        name = self._names.get(id(func))
        if name is None:
            name = self._names[id(func)] = f"aten::{func.__name__.split('.')[0]}"
        line, module = self._where()
        self.live[key] = Allocation(
            StorageWeakRef(storage),
            storage.data_ptr(),
            storage.nbytes(),
            self.state.step,
            self.state.phase(),
            name,
            line,
            module,
        )

    def _where(self) -> tuple[tuple[str, int] | None, str | None]:
        """The user's line (in backward: the forward line tagged on the node) and module."""
        stack = self.state.module_stack
        module = stack[-1] if stack else None
        tag = autograd_tag()
        if tag and tag[0] is not None:
            return (tag[0].file, tag[0].line), module or tag[1]
        found = self.frames.find(sys._getframe(3))
        return (None if found is None else (found.file, found.line)), module

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> MemoryWatch:
        if self._cuda_history and torch.cuda.is_available():
            with contextlib.suppress(Exception):
                torch.cuda.memory._record_memory_history(max_entries=_HISTORY_ENTRIES)
        self.__enter__()
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.__exit__(None, None, None)

    def prune(self) -> None:
        self.live = {k: a for k, a in self.live.items() if not a.ref.expired()}

    def live_bytes(self) -> int:
        return sum(a.nbytes for a in self.live.values())

    def carried_bytes(self, step: int) -> int:
        """Bytes allocated after the first step and before `step`, still alive."""
        return sum(a.nbytes for a in self.live.values() if 1 <= a.step < step)

    def figures(self) -> tuple[int, int]:
        """(allocated, reserved): the allocator's on CUDA, the live storages' on CPU."""
        if torch.cuda.is_initialized():
            return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        live = self.live_bytes()
        return live, live

    def end_step(self, step: int) -> None:
        """A step ended: its memory, and a walk from the user's variables when carried memory
        grew three steps in a row (at steps 3, 6, 12, ...: each walk costs a gc pass)."""
        with torch._C._DisableTorchDispatch():
            self.prune()
            allocated, reserved = self.figures()
            self.steps.append([step, allocated, reserved, self.carried_bytes(step)])
            carried = [s[3] for s in self.steps[-4:]]
            growing = len(carried) == 4 and all(b > a for a, b in itertools.pairwise(carried))
            if growing and step >= self._next_walk:
                self._next_walk = step * 2
                self.analysis = self._walk(sys._getframe(1), None, step)

    def _walk(self, frame: FrameType | None, tb: TracebackType | None, step: int) -> dict[str, Any]:
        from reprocut.record.inside.retainers import analyse

        return analyse(self.live, self.frames, frame, tb, step)

    def at_failure(self, exc: BaseException, error: str | None = None) -> None:
        """The script raised (an out-of-memory error, in the rerun): who holds what, now.
        `error`: the failure's own text, where it differs from `exc`'s (outcome.failure_error)."""
        _drop_own_frames(exc.__traceback__)
        with torch._C._DisableTorchDispatch():
            self.prune()
            step = self.state.step
            allocated, reserved = self.figures()
            tracked = {a.ptr for a in self.live.values()}
            self.failure = {
                "step": step,
                "allocated": allocated,
                "reserved": reserved,
                "error": error or f"{type(exc).__name__}: {exc}",
                **self._walk(None, exc.__traceback__, step),
                **_cuda_state(self.run_dir, self._cuda_history, tracked),
            }
            workspaces = self.failure.pop("library_bytes", 0)
            if workspaces:
                self.failure["roles"]["library workspaces"] = workspaces

    def write(self) -> None:
        device = "cuda" if torch.cuda.is_initialized() else "cpu"  # a run that did not fail too
        data = {"steps": self.steps, "analysis": self.analysis, "failure": self.failure,
                "device": device}  # fmt: skip
        atomic_write(self.run_dir / MEMORY_FILE, json.dumps(data, default=str))


_PACKAGE = str(Path(__file__).resolve().parents[2])


def _drop_own_frames(tb: TracebackType | None) -> None:
    """Clear the failure's traceback from reprocut's first dispatch frame inward: its modes'
    calls of the failing op (and torch's frames below them) hold that op's arguments (on the
    H200, a 36 GiB softmax saved for backward), which are not the user's references to them.
    Executing frames (the child's own) refuse and are kept."""
    inside = False
    while tb is not None:
        code = tb.tb_frame.f_code
        inside = inside or (
            code.co_filename.startswith(_PACKAGE) and code.co_name == "__torch_dispatch__"
        )
        if inside:
            with contextlib.suppress(RuntimeError):
                tb.tb_frame.clear()
        tb = tb.tb_next


def _cuda_state(run_dir: Path, history: bool, tracked: set[int]) -> dict[str, Any]:
    """The device's free and total memory, the allocator's largest free cached block, the
    bytes of library workspaces among the blocks no op made (`tracked`: the ops' data
    pointers), and the allocator snapshot (for pytorch.org/memory_viz) where its history was
    recorded: one snapshot, its stacks symbolized once, serves all three."""
    if not torch.cuda.is_initialized():
        return {}
    state: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        free, total = torch.cuda.mem_get_info()
        state.update(device_free=free, device_total=total)
    with contextlib.suppress(Exception):
        snapshot = torch.cuda.memory._snapshot()
        largest, expandable = snapshot_free_blocks(snapshot["segments"])
        state.update(largest_free_block=largest, expandable_segments=expandable)
        state["library_bytes"] = library_blocks(snapshot["segments"], tracked)
        if history:
            with (run_dir / SNAPSHOT_FILE).open("wb") as sink:  # as _dump_snapshot writes it
                pickle.dump(snapshot, sink)
            state["snapshot"] = SNAPSHOT_FILE
    return state
