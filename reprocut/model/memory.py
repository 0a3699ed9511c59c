"""What reprocut found out about memory: an OOM's request and why it is that big, who held the
memory, how it grew per step, the leak and what keeps it alive.

`record` builds a MemoryReport for every out-of-memory failure (from a rerun to the failing
step) and for a `record --memory` run that did not fail; report/ shows it, shrink reads its
`cause` to decide whether an op-level repro can fail the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reprocut.model.case import SourceLocation
from reprocut.model.nonfinite import location_from_json, location_json

# why the allocation failed: the request alone exceeds what the device (or the CPU allocator)
# could give, or it failed only because other memory was held
CAUSE_REQUEST = "request"
CAUSE_HELD = "held"

ROLES = (
    "parameters",
    "gradients",
    "optimizer state",
    "saved for backward",
    "other live tensors",
    "library workspaces",  # cuBLAS/cuDNN workspaces through PyTorch's allocator (CUDA)
    "allocator cache",
    "untracked",
)


@dataclass(frozen=True, slots=True)
class Holder:
    """Live memory made at one line (by one op, in one module)."""

    line: SourceLocation | None
    module: str | None
    op: str | None
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "line": location_json(self.line),
            "module": self.module,
            "op": self.op,
            "bytes": self.bytes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Holder:
        return cls(
            location_from_json(data.get("line")), data.get("module"), data.get("op"), data["bytes"]
        )


@dataclass(frozen=True, slots=True)
class StepMemory:
    """Memory held at the end of one step: allocated (live tensors) and reserved (the
    allocator's cache included; equal on CPU), and of the allocated what was kept from earlier
    steps (allocated after the first step and still alive)."""

    step: int
    allocated: int
    reserved: int
    carried: int = 0

    def to_json(self) -> list[int]:
        return [self.step, self.allocated, self.reserved, self.carried]

    @classmethod
    def from_json(cls, data: list[int]) -> StepMemory:
        return cls(*data)


@dataclass(frozen=True, slots=True)
class Leak:
    """Allocations that outlive their step: the line that made them, and the reference path
    from the user's variable that keeps them alive."""

    line: SourceLocation | None  # where the surviving tensors were allocated
    op: str | None
    bytes_per_step: int
    text: str  # one sentence: what grows, by how much, kept by whom
    retainer: tuple[str, ...]  # the path, one step per item, from the user's variable
    fix: str  # the class of fix: detach / .item() / no_grad / keep fewer
    kept_at: SourceLocation | None = None  # the line that stores into the retaining variable

    def to_json(self) -> dict[str, Any]:
        return {
            "line": location_json(self.line),
            "op": self.op,
            "bytes_per_step": self.bytes_per_step,
            "text": self.text,
            "retainer": list(self.retainer),
            "fix": self.fix,
            "kept_at": location_json(self.kept_at),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Leak:
        return cls(
            line=location_from_json(data.get("line")),
            op=data.get("op"),
            bytes_per_step=data["bytes_per_step"],
            text=data["text"],
            retainer=tuple(data.get("retainer", ())),
            fix=data.get("fix", ""),
            kept_at=location_from_json(data.get("kept_at")),
        )


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """Reserved but unallocated memory against the request (CUDA's caching allocator)."""

    cached_bytes: int  # reserved by PyTorch, not allocated
    largest_free_block: int | None
    expandable_segments_would_help: bool | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "cached_bytes": self.cached_bytes,
            "largest_free_block": self.largest_free_block,
            "expandable_segments_would_help": self.expandable_segments_would_help,
            "text": self.text,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fragmentation:
        return cls(
            data["cached_bytes"],
            data.get("largest_free_block"),
            data.get("expandable_segments_would_help"),
            data.get("text", ""),
        )


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Memory at an out-of-memory failure (or over a `record --memory` run)."""

    device: str = "cpu"
    requested_bytes: int | None = None
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    cause: str | None = None  # CAUSE_REQUEST, CAUSE_HELD; None for a run that did not fail
    why: tuple[str, ...] = ()  # sentences: why the request is that big, why it failed
    allocated_bytes: int | None = None  # the allocator's own figure at the failure
    reserved_bytes: int | None = None
    held: tuple[tuple[str, int], ...] = ()  # bytes by role (ROLES order), summing to reserved
    top: tuple[Holder, ...] = ()  # by allocating line, largest first
    steps: tuple[StepMemory, ...] = ()
    failing_step: int | None = None
    growth_per_step_bytes: int | None = None
    leak: Leak | None = None
    fragmentation: Fragmentation | None = None
    plot: str | None = None  # file names in the run folder
    snapshot: str | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "requested_bytes": self.requested_bytes,
            "device_total_bytes": self.device_total_bytes,
            "device_free_bytes": self.device_free_bytes,
            "cause": self.cause,
            "why": list(self.why),
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "held": dict(self.held),
            "top": [holder.to_json() for holder in self.top],
            "steps": [step.to_json() for step in self.steps],
            "failing_step": self.failing_step,
            "growth_per_step_bytes": self.growth_per_step_bytes,
            "leak": None if self.leak is None else self.leak.to_json(),
            "fragmentation": None if self.fragmentation is None else self.fragmentation.to_json(),
            "plot": self.plot,
            "snapshot": self.snapshot,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryReport:
        leak, fragmentation = data.get("leak"), data.get("fragmentation")
        return cls(
            device=data.get("device", "cpu"),
            requested_bytes=data.get("requested_bytes"),
            device_total_bytes=data.get("device_total_bytes"),
            device_free_bytes=data.get("device_free_bytes"),
            cause=data.get("cause"),
            why=tuple(data.get("why", ())),
            allocated_bytes=data.get("allocated_bytes"),
            reserved_bytes=data.get("reserved_bytes"),
            held=tuple((str(k), int(v)) for k, v in (data.get("held") or {}).items()),
            top=tuple(Holder.from_json(h) for h in data.get("top", ())),
            steps=tuple(StepMemory.from_json(s) for s in data.get("steps", ())),
            failing_step=data.get("failing_step"),
            growth_per_step_bytes=data.get("growth_per_step_bytes"),
            leak=None if not leak else Leak.from_json(leak),
            fragmentation=None if not fragmentation else Fragmentation.from_json(fragmentation),
            plot=data.get("plot"),
            snapshot=data.get("snapshot"),
            notes=tuple(data.get("notes", ())),
        )
