"""The memory the child analysed (memory.json), in the model's terms and in words: holders by
line, the leak with its retainer path and the class of fix, growth per step."""

from __future__ import annotations

import os
from typing import Any

from reprocut.localize.failure import location
from reprocut.model.case import SourceLocation
from reprocut.model.memory import Holder, Leak, StepMemory
from reprocut.model.oom import format_bytes

FIX_GRAPH = (
    "keep `.item()` (or `.detach()`) of the tensor instead of the tensor, or compute it under "
    "`torch.no_grad()`: a tensor with a grad_fn keeps its whole autograd graph alive"
)
FIX_TENSORS = "keep fewer of these tensors, move them off the device (`.cpu()`), or `del` them"


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


def growth_per_step(steps: tuple[StepMemory, ...]) -> int | None:
    """The least-squares slope of allocated bytes over the steps after the first (the first
    makes gradients and optimizer state); None with fewer than three such steps."""
    points = [(s.step, s.allocated) for s in steps if s.step >= 1]
    if len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if not var:
        return None
    return int(sum((x - mean_x) * (y - mean_y) for x, y in points) / var)


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


def leak_of(analysis: dict[str, Any] | None, growth: int | None) -> Leak | None:
    """The leak, if memory carried across steps grew and a variable reaches it."""
    if not analysis or not analysis.get("leaked") or not growth or growth <= 0:
        return None
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
