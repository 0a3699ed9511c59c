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
    "recomputed for backward",  # activation checkpointing's recompute, held for its backward
    "backward temporaries",  # gradients in flight inside backward (not yet a parameter's .grad)
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
    """Memory held at the end of one step (or at the failure): allocated (live tensors) and
    reserved (the allocator's cache included; equal on CPU), and of the allocated what was kept
    from earlier steps (allocated after the first step and still alive; None: not measured)."""

    step: int
    allocated: int
    reserved: int
    carried: int | None = 0

    def to_json(self) -> list[int | None]:
        return [self.step, self.allocated, self.reserved, self.carried]

    @classmethod
    def from_json(cls, data: list[int | None]) -> StepMemory:
        return cls(*data)  # type: ignore[arg-type]


# A leak is claimed only with evidence (LeakEvidence): memory carried from step to step rose
# at most of the steps where it changed, by at least this much per step, and at that rate
# would fill a visible share of the device over a run of LEAK_HORIZON_STEPS steps.
LEAK_MIN_BYTES_PER_STEP = 1 << 20
LEAK_MIN_RISING_SHARE = 0.75  # of the step-to-step changes of carried memory, rises
LEAK_MIN_INTERVALS = 3  # step-to-step changes needed to judge at all
LEAK_HORIZON_STEPS = 1000
LEAK_MIN_DEVICE_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class LeakEvidence:
    """Whether memory carried from step to step grew enough, and consistently enough, to call
    it a leak; the figures and thresholds that decided, and the reason in words."""

    claimed: bool
    reason: str
    bytes_per_step: int  # carried memory's net change per step, its largest single step left out
    intervals: int  # step-to-step changes seen
    rising: int  # of them, rises
    falling: int
    device_bytes: int | None  # the device's (or the machine's) memory the projection is against
    min_bytes_per_step: int = LEAK_MIN_BYTES_PER_STEP
    min_rising_share: float = LEAK_MIN_RISING_SHARE
    horizon_steps: int = LEAK_HORIZON_STEPS
    min_device_share: float = LEAK_MIN_DEVICE_SHARE

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LeakEvidence:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class Skipped:
    """A stage of the memory analysis that did not finish (over its time budget, or failed):
    the report goes out without it and says so."""

    stage: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"stage": self.stage, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Skipped:
        return cls(str(data["stage"]), str(data["reason"]))


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
class HeldBy:
    """The user's variable that keeps most of the memory held at the failure alive, when no
    leak across steps explains it (a loss summed over micro-batches keeps each one's graph):
    the reference path from it and the class of fix."""

    bytes: int
    text: str
    retainer: tuple[str, ...]
    fix: str
    kept_at: SourceLocation | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "text": self.text,
            "retainer": list(self.retainer),
            "fix": self.fix,
            "kept_at": location_json(self.kept_at),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldBy:
        return cls(
            int(data["bytes"]),
            data["text"],
            tuple(data.get("retainer", ())),
            data.get("fix", ""),
            location_from_json(data.get("kept_at")),
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
    phase: str | None = None  # in words: "backward", "recompute of the checkpointed block ..."
    evidence: LeakEvidence | None = None  # why a leak was claimed, or why memory was flat
    held_by: HeldBy | None = None
    skipped: tuple[Skipped, ...] = ()  # stages that did not finish: the report went without
    seconds: tuple[tuple[str, float], ...] = ()  # what the analysis cost, by stage

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
            "phase": self.phase,
            "evidence": None if self.evidence is None else self.evidence.to_json(),
            "held_by": None if self.held_by is None else self.held_by.to_json(),
            "skipped": [s.to_json() for s in self.skipped],
            "seconds": dict(self.seconds),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryReport:
        leak, fragmentation = data.get("leak"), data.get("fragmentation")
        evidence, held_by = data.get("evidence"), data.get("held_by")
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
            phase=data.get("phase"),
            evidence=None if not evidence else LeakEvidence.from_json(evidence),
            held_by=None if not held_by else HeldBy.from_json(held_by),
            skipped=tuple(Skipped.from_json(s) for s in data.get("skipped", ())),
            seconds=tuple((str(k), float(v)) for k, v in (data.get("seconds") or {}).items()),
        )
