"""The per-run state the recorder and its hooks share: where the script is and what it left.

The recorder (recorder.py) advances it at step boundaries and module hooks; the dispatch mode
(ops.py), the function mode (calls.py), the public calls found on the stack (public.py) and the
finite checks (finite_watch.py) read it and add to it; outcome.py writes it out. It imports
none of them: each is handed this one object, so none needs the recorder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from reprocut.record.inside.capture import HeldCall
from reprocut.record.inside.records import Culprit, Snapshot

# a public call in flight, as the function mode saw it: (function, public name, args, kwargs)
PublicEntry = tuple[Any, str | None, tuple[Any, ...], dict[str, Any]]


@dataclass(slots=True)
class RunState:
    """Where the script is (training step, phase, module stack) and what this run holds."""

    step: int = 0
    optimizer_seen: bool = False
    in_optimizer: int = 0
    root_forwards: int = 0
    module_stack: list[str] = field(default_factory=list)
    # Set by the recorder at step boundaries (see Recorder.wants_every_op and _end_step):
    localizing: bool = False  # the step is in the localize window: synchronize around its ops
    light_step: bool = True  # the step records only the asserting ops (no dispatch mode)
    module_hooks: bool = False  # module hooks keep module_stack (else: found on the stack)
    raise_watched: bool = False  # a light step whose raising call is watched again (CPU)
    # What the current step recorded: its ops' specs, its asserting ops' snapshots
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    seq: int = 0  # snapshots numbered across the run
    last_op: str | None = None
    # steps not yet known complete: (step, (device, its event), its snapshots)
    pending: list[tuple[int, tuple[int, Any], list[Snapshot]]] = field(default_factory=list)
    healthy_through: int = -1  # last step whose kernels are known to have completed
    culprit: Culprit | None = None
    # A light step's culprit, noted by the tripwire without the public call around it: the
    # exception it raised, until the raise watch (raise_watch.py) completes the culprit
    light_culprit: BaseException | None = None
    # A torch call raised in a light step and the raise watch could not watch it again (a
    # backward, or a rerun that did not fail alike): only a rerun of the step names its op
    raise_missed: bool = False
    # the culprit's error as its op raised it ({type, message, code}): PyTorch can lose it on
    # its way out of a CUDA backward thread (outcome.error_lost_on_the_way)
    culprit_error: dict[str, Any] | None = None
    # the outermost public call in flight (calls.py), its arguments captured once asked for
    public_stack: list[PublicEntry] = field(default_factory=list)
    public_captured: dict[int, HeldCall] = field(default_factory=dict)
    # under pytest: the running test function's code (pytest_watch.py), whose line an op's
    # record keeps (an asynchronous CUDA error is met at the test's teardown, past its lines)
    test_code: Any = None

    def phase(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return "forward"

    def test_line(self, frame: FrameType | None) -> int | None:
        """The running test's line on the stack from `frame` outward (None: not under pytest,
        or not called from the test's own body)."""
        code = self.test_code
        while code is not None and frame is not None:
            if frame.f_code is code:
                return frame.f_lineno
            frame = frame.f_back
        return None

    def all_snapshots(self) -> list[Snapshot]:
        """Snapshots of every step not yet known to have completed, oldest first."""
        return [s for _, _, snapshots in self.pending for s in snapshots] + self.snapshots
