"""The memory the child analysed (memory.json), in the model's terms and in words: holders by
line, growth per step and whether it is a leak (LeakEvidence), the leak with its retainer path
and the class of fix, and at a failure the variable that keeps the step's activations."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from typing import Any

from reprocut.localize.failure import location
from reprocut.model.case import SourceLocation
from reprocut.model.memory import (
    LEAK_HORIZON_STEPS,
    LEAK_MIN_BYTES_PER_STEP,
    LEAK_MIN_DEVICE_SHARE,
    LEAK_MIN_INTERVALS,
    LEAK_MIN_RISING_SHARE,
    HeldBy,
    Holder,
    Leak,
    LeakEvidence,
    StepMemory,
)
from reprocut.model.oom import format_bytes

FIX_GRAPH = (
    "keep `.item()` (or `.detach()`) of the tensor instead of the tensor, or compute it under "
    "`torch.no_grad()`: a tensor with a grad_fn keeps its whole autograd graph alive"
)
FIX_TENSORS = "keep fewer of these tensors, move them off the device (`.cpu()`), or `del` them"
FIX_SUMMED = (
    "call `backward()` on each micro-batch's loss (divided by the number of micro-batches) as "
    "soon as it is computed, and add up `loss.item()` for logging: a sum of losses keeps every "
    "micro-batch's autograd graph, with its activations, until the sum's backward"
)
FIX_ACTIVATIONS = (
    "these are the step's own activations, kept for its backward: a smaller batch or sequence, "
    "activation checkpointing (`torch.utils.checkpoint`) or lower precision makes them smaller"
)


def line_of(data: Any) -> SourceLocation | None:
    """A [file, line] pair from the child, with its text."""
    if not data:
        return None
    return location({"file": data[0], "line": data[1]})


def short(where: SourceLocation | None) -> str:
    return "an unknown line" if where is None else f"{os.path.basename(where.file)}:{where.line}"


def holders(groups: list[dict[str, Any]]) -> tuple[Holder, ...]:
    return tuple(
        Holder(line_of(g.get("line")), g.get("module"), g.get("op"), int(g["bytes"]))
        for g in groups
    )


def leak_evidence(steps: tuple[StepMemory, ...], device_bytes: int | None) -> LeakEvidence | None:
    """Whether memory carried from step to step (made after the first step, still alive) grew
    like a leak: up at most of the steps where it changed, not a slope fitted to noise, and by
    an amount that matters (model/memory.py's thresholds). None with no step after the first."""
    points = [s.carried for s in steps if s.step >= 1 and s.carried is not None]
    if len(points) < 2:
        return None
    changes = [b - a for a, b in itertools.pairwise(points)]
    n = len(changes)
    rising = sum(1 for c in changes if c > 0)
    falling = sum(1 for c in changes if c < 0)
    # the net growth without its largest single change, per step: one allocation that stays
    # (a cache made at step 5) is not a rate, and must not make 4 B a step look like a leak
    largest = max(changes)
    per_step = int((points[-1] - points[0] - max(largest, 0)) / max(n - 1, 1))
    evidence = LeakEvidence(False, "", per_step, n, rising, falling, device_bytes)
    if n < LEAK_MIN_INTERVALS:
        return replace(evidence, reason=f"too few steps to judge a leak ({n + 1} after the first)")
    projected = per_step * LEAK_HORIZON_STEPS
    share = projected / device_bytes if device_bytes else None
    if not rising and not falling:
        return replace(
            evidence,
            reason=f"memory was flat: memory carried from step to step did not change "
            f"over {n} steps",
        )
    if rising < 2 or rising < LEAK_MIN_RISING_SHARE * (rising + falling):
        return replace(
            evidence,
            reason=f"memory was flat: memory carried from step to step rose at {rising} and fell "
            f"at {falling} of {n} steps (a leak rises at {LEAK_MIN_RISING_SHARE:.0%} of the "
            "steps where it changes)",
        )
    needs = (
        f"a leak needs at least {format_bytes(LEAK_MIN_BYTES_PER_STEP)} per step and "
        f"{LEAK_MIN_DEVICE_SHARE:.0%} of the device over {LEAK_HORIZON_STEPS} steps"
    )
    device = "" if share is None else f", {share:.1%} of {format_bytes(device_bytes)}"
    over = f"{format_bytes(max(projected, 0))} over {LEAK_HORIZON_STEPS} steps{device}"
    if per_step < LEAK_MIN_BYTES_PER_STEP:
        return replace(
            evidence,
            reason=f"memory was flat: memory carried from step to step grew "
            f"{format_bytes(per_step)} per step ({over}); {needs}",
        )
    if share is not None and share < LEAK_MIN_DEVICE_SHARE:
        return replace(
            evidence,
            reason=f"no leak claimed: memory carried from step to step grew "
            f"{format_bytes(per_step)} per step, {over}; {needs}",
        )
    device = "" if share is None else f", {share:.0%} of {format_bytes(device_bytes)}"
    return replace(
        evidence,
        claimed=True,
        reason=f"memory carried from step to step rose at {rising} of {n} steps, "
        f"{format_bytes(per_step)} per step: {format_bytes(projected)} over "
        f"{LEAK_HORIZON_STEPS} steps{device}",
    )


def retainer_path(retainer: dict[str, Any]) -> tuple[str, ...]:
    """`history` (a list made at train.py:41) -> its 14 items -> each item's autograd graph ->
    the tensors saved by AddmmBackward0 (aten::relu at train.py:22)."""
    made = line_of(retainer.get("made_at"))
    kind = retainer.get("kind") or "object"
    root = f"`{retainer['name']}` (a {kind}" + (f" made at {short(made)})" if made else ")")
    path = [root]
    container = retainer.get("items") is not None
    if container:
        path.append(f"its {retainer['items']} items")
    if retainer.get("graph"):
        whose = "each item's" if container else "its"
        graph_root = retainer.get("graph_root")
        path.append(f"{whose} autograd graph" + (f" (from {graph_root})" if graph_root else ""))
        saved_at = line_of(retainer.get("saved_at"))
        path.append(
            f"the tensors saved by {retainer.get('saver')} "
            f"({retainer.get('saved_by_op')} at {short(saved_at)})"
        )
    else:
        path.append(
            f"the tensors themselves ({retainer.get('saved_by_op')} at "
            f"{short(line_of(retainer.get('saved_at')))})"
        )
    return tuple(path)


def leak_of(analysis: dict[str, Any] | None, evidence: LeakEvidence | None) -> Leak | None:
    """The leak, when the evidence claims one: the lines that made what outlives its step, and
    the variable that reaches it."""
    if not analysis or not analysis.get("leaked") or evidence is None or not evidence.claimed:
        return None
    growth = evidence.bytes_per_step
    top = analysis["leaked"][0]
    line = line_of(top.get("line"))
    retainer = analysis.get("retainer")
    steps = max(1, int(analysis.get("leaked_steps") or 1))
    per_step = int((retainer or {}).get("bytes", analysis.get("leaked_bytes", 0)) / steps)
    made_by = f"{top.get('op')} at {short(line)}" + (
        f" in {top['module']}" if top.get("module") else ""
    )
    if retainer is None:
        return Leak(
            line=line,
            op=top.get("op"),
            bytes_per_step=per_step,
            text=f"memory made by {made_by} outlives its step ({format_bytes(growth)} more per "
            "step); no variable of your code was found holding it",
            retainer=(),
            fix=FIX_TENSORS,
        )
    path = retainer_path(retainer)
    kept_at = line_of(retainer.get("kept_at"))
    kept = f", stored at {short(kept_at)}" if kept_at else ""
    graph = retainer.get("graph")
    return Leak(
        line=line,
        op=top.get("op"),
        bytes_per_step=per_step,
        text=f"`{retainer['name']}`{kept} keeps {format_bytes(per_step)} per step alive: "
        + " -> ".join(path[1:]),
        retainer=path,
        fix=FIX_GRAPH if graph else FIX_TENSORS,
        kept_at=kept_at,
    )


def held_by_of(analysis: dict[str, Any] | None) -> HeldBy | None:
    """At a failure, the variable that keeps most of the step's saved activations alive, when
    it keeps at least half of them."""
    holder = (analysis or {}).get("holder")
    roles = (analysis or {}).get("roles") or {}
    saved = roles.get("saved for backward", 0) + roles.get("recomputed for backward", 0)
    if not holder or not holder.get("graph") or not saved or holder.get("bytes", 0) < saved / 2:
        return None
    path = retainer_path(holder)
    kept_at = line_of(holder.get("kept_at"))
    if kept_at is None:
        fix = FIX_ACTIVATIONS
    else:
        fix = FIX_SUMMED if holder.get("kind") == "Tensor" else FIX_GRAPH
    added = f", added to at {short(kept_at)}" if kept_at else ""
    return HeldBy(
        bytes=int(holder["bytes"]),
        text=f"`{holder['name']}`{added} keeps {format_bytes(holder['bytes'])} alive: "
        + " -> ".join(path[1:]),
        retainer=path,
        fix=fix,
        kept_at=kept_at,
    )
