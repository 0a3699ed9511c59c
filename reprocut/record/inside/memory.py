"""Inside the user's process (`record --memory`, and the rerun of an out-of-memory failure):
which op and line made each live storage, and how much memory each step ends with.

A dispatch mode below the recorder's own sees every op's outputs and keeps a weak reference to
each new storage with its size, step, phase, op, line and module; a storage that dies drops out
when a step ends. That costs a Python call per op, so it never runs in the normal record path:
only when asked (`--memory`) or in the rerun to a failing step. At each step's end the live
bytes (on CUDA the allocator's allocated and reserved bytes) are kept; when memory carried over
from earlier steps keeps growing, `retainers.py` walks from the user's variables to the
surviving tensors. The failure itself is taken where the allocation fails, inside the op that
raised (memory_failure.py): the allocator's figures and the holders as they were then, before
the unwinding frees what backward had in flight. Everything goes to memory.json.

Activation checkpointing runs forward ops again inside backward ("recompute"): grad mode is on
while a backward graph task runs. Their allocations are kept under that phase, and their outputs'
autograd nodes (a reentrant checkpoint builds a new graph there, which no function mode sees)
are tagged with the user's line once they have nodes, so a backward op of that graph knows the
forward line that built it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from reprocut.model.budget import Deadline
from reprocut.model.oom import is_out_of_memory
from reprocut.model.publicapi import aten_name
from reprocut.model.recording import atomic_write
from reprocut.record.inside.frames import UserFrames
from reprocut.record.inside.memory_failure import (
    SNAPSHOT_FILE,
    capture_failure,
    in_checkpoint,
    stack_from,
)
from reprocut.record.inside.state import RunState
from reprocut.record.inside.where import autograd_tag

MEMORY_FILE = "memory.json"
__all__ = ["MEMORY_FILE", "SNAPSHOT_FILE", "Allocation", "MemoryWatch"]
_HISTORY_ENTRIES = 200_000  # allocator events kept for the snapshot (CUDA reruns only)
_CAPTURES = 3  # out-of-memory errors taken where they are raised (a script may catch some)
_RECOMPUTED_LIMIT = 10_000  # recompute outputs waiting for their autograd nodes
_STEP_WALK_SECONDS = 5.0


@dataclass(slots=True)
class Allocation:
    """A storage some op made, kept by weak reference."""

    ref: Any  # StorageWeakRef
    ptr: int  # its data pointer: the allocator snapshot's block address
    nbytes: int
    step: int
    phase: str  # "forward", "backward", "recompute", "optimizer"
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
        self.cuda_history = cuda_history
        self._next_walk = 3
        self._names: dict[int, str] = {}
        self._captures = 0
        self._captured_message: str | None = None  # the error the failure was taken at
        self._recomputed: list[tuple[Any, tuple[Any, ...]]] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        phase = self._phase()
        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:
            if self._captures < _CAPTURES and is_out_of_memory(type(exc).__name__, str(exc)):
                self._captures += 1
                self._at_raise(func, exc, phase)
            raise
        if isinstance(result, torch.Tensor):
            self._note(func, result, phase)
        elif isinstance(result, (tuple, list)):
            for item in result:
                if isinstance(item, torch.Tensor):
                    self._note(func, item, phase)
        return result

    def _phase(self) -> str:
        """The state's phase; in backward with grad mode on and torch.utils.checkpoint on the
        stack, its recompute (grad mode on alone is also a `create_graph` backward). A plain
        backward op first tags what a recompute made (see the docstring)."""
        phase = self.state.phase()
        if phase == "backward":
            if torch.is_grad_enabled():
                return "recompute" if in_checkpoint(sys._getframe(2)) else phase
            if self._recomputed:
                self._tag_recomputed()
        return phase

    def _name(self, func: Any) -> str:
        name = self._names.get(id(func))
        if name is None:
            name = self._names[id(func)] = aten_name(func)
        return name

    def _note(self, func: Any, tensor: torch.Tensor, phase: str) -> None:
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
        line, module = self._where(phase)
        if phase == "recompute" and len(self._recomputed) < _RECOMPUTED_LIMIT:
            caller = sys._getframe(2)
            location = self.frames.find(caller)
            tag = (location, module, self.frames.call_site(caller))
            self._recomputed.append((weakref.ref(tensor), tag))
        self.live[key] = Allocation(
            StorageWeakRef(storage),
            storage.data_ptr(),
            storage.nbytes(),
            self.state.step,
            phase,
            self._name(func),
            line,
            module,
        )

    def _where(self, phase: str) -> tuple[tuple[str, int] | None, str | None]:
        """The user's line and module. In backward no user frame is on the stack: the forward
        line tagged on the running node. In a recompute the block's own frames are, and the
        running node is the checkpoint's: its line only when no user frame is found."""
        stack = self.state.module_stack
        module = stack[-1] if stack else None
        tag = autograd_tag()
        if phase == "backward" and tag and tag[0] is not None:
            return (tag[0].file, tag[0].line), module or tag[1]
        found = self.frames.find(sys._getframe(3))
        if found is None and tag and tag[0] is not None:
            return (tag[0].file, tag[0].line), module or tag[1]
        return (None if found is None else (found.file, found.line)), module

    def _tag_recomputed(self) -> None:
        """Tag the autograd nodes of what a recompute made (they have their nodes by now)."""
        for ref, tag in self._recomputed:
            tensor = ref()
            grad_fn = None if tensor is None else tensor.grad_fn
            if grad_fn is not None and "reprocut" not in grad_fn.metadata:
                grad_fn.metadata["reprocut"] = tag
        self._recomputed.clear()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> MemoryWatch:
        if self.cuda_history and torch.cuda.is_available():
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
            stack = stack_from(sys._getframe(1))
            self.prune()
            allocated, reserved = self.figures()
            self.steps.append([step, allocated, reserved, self.carried_bytes(step)])
            carried = [s[3] for s in self.steps[-4:]]
            growing = len(carried) == 4 and all(b > a for a, b in itertools.pairwise(carried))
            if growing and step >= self._next_walk:
                self._next_walk = step * 2
                from reprocut.record.inside.retainers import analyse

                deadline = Deadline(_STEP_WALK_SECONDS)
                self.analysis = analyse(self.live, self.frames, stack, step, deadline)

    def _at_raise(self, func: Any, exc: BaseException, phase: str) -> None:
        """An allocation failed inside this op: the failure as it is now (memory_failure.py)."""
        with torch._C._DisableTorchDispatch():
            self._tag_recomputed()
            self.failure = capture_failure(
                self, self._name(func), f"{type(exc).__name__}: {exc}", phase, sys._getframe(2)
            )
            self._captured_message = str(exc)

    def at_failure(self, exc: BaseException, error: str | None = None) -> None:
        """The script raised. An out-of-memory error taken where it was raised keeps that
        capture (the error's own figures); anything else is taken now, after the unwinding.
        `error`: the failure's own text, where it differs from `exc`'s (outcome.failure_error)."""
        text = error or f"{type(exc).__name__}: {exc}"
        _drop_own_frames(exc.__traceback__)
        if self.failure is not None and self._captured_message and self._captured_message in text:
            self.failure["error"] = text
            return
        with torch._C._DisableTorchDispatch():
            self.failure = capture_failure(
                self, None, text, self.state.phase(), None, tb=exc.__traceback__
            )
            self.failure["taken"] = "after the error unwound"

    def write(self) -> None:
        device = "cuda" if torch.cuda.is_initialized() else "cpu"  # a run that did not fail too
        data = {"steps": self.steps, "analysis": self.analysis, "failure": self.failure,
                "device": device}  # fmt: skip
        if device == "cuda":  # what a leak would fill (LeakEvidence)
            with contextlib.suppress(Exception):
                data["device_total"] = torch.cuda.mem_get_info()[1]
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
