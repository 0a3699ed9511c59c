"""An out-of-memory failure's MemoryReport: a rerun to the failing step under the memory watch.

The allocator raises at the op that asks, synchronously, so the first run already names the
op; what it cannot say is who held the memory and why the request is that big. One rerun with
the memory watch on (record/inside/memory.py: every storage's maker, memory per step, the
holders and the leak's retainer at the failure, the allocator snapshot on CUDA) answers that;
`record --memory` runs had it on already. An OOM in a light step (where no op was watched)
gets its culprit from the same rerun, every step recorded.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from reprocut.localize.culprit import from_culprit, names_op
from reprocut.localize.failure import (
    LocalizeOptions,
    Progress,
    error_info,
    location,
    script_error,
)
from reprocut.localize.leak_text import growth_per_step, holders, leak_of
from reprocut.localize.oom_why import explain_request, request_alone_too_big
from reprocut.model.memory import (
    CAUSE_HELD,
    CAUSE_REQUEST,
    ROLES,
    Fragmentation,
    MemoryReport,
    StepMemory,
)
from reprocut.model.oom import (
    cpu_allocator_refused,
    device_figures,
    format_bytes,
    is_out_of_memory,
    requested_bytes,
)
from reprocut.model.recording import Failure, RunDir
from reprocut.record.inside.memory import MEMORY_FILE
from reprocut.record.parent.runner import RunRequest, RunResult, run_script
from reprocut.report.memory_plot import PLOT_FILE, write_plot


def is_oom_failure(failure: Failure) -> bool:
    return is_out_of_memory(failure.error.type, failure.error.message)


def is_oom_outcome(outcome: dict[str, Any] | None) -> bool:
    error = (outcome or {}).get("error")
    return bool(error) and is_out_of_memory(error["type"], error["message"])


def memory_rerun(options: LocalizeOptions, progress: Progress, why: str) -> RunResult:
    progress(f"{why}; rerunning with the memory watch on (who made each tensor, what holds it)")
    return run_script(
        RunRequest(
            options.script,
            options.argv,
            options.run_dir.path,
            "memory",
            snapshots=False,
            light_steps=False,
            memory=True,
            timeout=options.timeout,
            cwd=options.cwd,
            launch=options.launch,
        )
    )


def read_memory(run_dir: RunDir) -> dict[str, Any]:
    """What the memory watch wrote into the run folder ({} when it wrote nothing readable)."""
    path = run_dir.path / MEMORY_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def oom_in_light_step(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], progress: Progress
) -> Failure:
    """No op was watched when the allocation failed: one rerun names it and the holders."""
    second = memory_rerun(
        options, progress, f"out of memory at step {outcome['step']}, in a step not watched"
    )
    culprit = (second.outcome or {}).get("culprit")
    if names_op(culprit):
        failure = from_culprit(options, first, outcome, culprit, second, "rerun")
    else:
        failure = script_error(options, first, error_info(outcome["error"], first.stderr), outcome)
    return attach(options, failure, read_memory(options.run_dir))


def with_memory(options: LocalizeOptions, failure: Failure, progress: Progress) -> Failure:
    """`failure` (an OOM) with its MemoryReport: from this run's memory watch, or a rerun."""
    data = read_memory(options.run_dir) if options.memory else {}
    if not data.get("failure"):
        rerun = memory_rerun(options, progress, f"out of memory in {failure.op or 'the script'}")
        data = read_memory(options.run_dir)
        failure = with_forward_line(failure, (rerun.outcome or {}).get("culprit"))
    return attach(options, failure, data)


def with_forward_line(failure: Failure, culprit: dict[str, Any] | None) -> Failure:
    """A backward op's forward line from the rerun's culprit: on a GPU the first run tags
    autograd nodes only in the steps it watches every public call, the rerun in every step."""
    if failure.phase != "backward" or failure.forward_source is not None or not culprit:
        return failure
    forward = location(culprit.get("forward_source"))
    if forward is None or culprit.get("op") != failure.op:
        return failure
    return replace(failure, forward_source=forward, source=failure.source or forward)


def attach(options: LocalizeOptions, failure: Failure, data: dict[str, Any]) -> Failure:
    report = build_report(failure, data, options.run_dir.path)
    failure = replace(failure, memory=report)
    options.run_dir.write_failure(failure)
    return failure


def build_report(failure: Failure | None, data: dict[str, Any], run_dir: Any) -> MemoryReport:
    """The MemoryReport from the memory watch's findings (and the failure, if any)."""
    steps = tuple(StepMemory.from_json(s) for s in data.get("steps", ()))
    at_failure = data.get("failure") or {}
    analysis = at_failure or data.get("analysis") or {}
    growth = growth_per_step(steps)
    device = failure.device if failure is not None else data.get("device", "cpu")
    report = MemoryReport(
        device=device,
        steps=steps,
        growth_per_step_bytes=growth,
        top=holders(analysis.get("top", [])),
        leak=leak_of(analysis, growth),
        failing_step=at_failure.get("step") if failure is not None else None,
    )
    if analysis:
        report = replace(report, held=_held(analysis))
    if at_failure:
        report = replace(
            report,
            allocated_bytes=at_failure.get("allocated"),
            reserved_bytes=at_failure.get("reserved"),
            snapshot=at_failure.get("snapshot"),
        )
    if failure is not None:
        report = _request(report, failure, at_failure)
        if at_failure.get("allocated") is not None:  # the failing step's point in the picture
            point = StepMemory(
                at_failure["step"], at_failure["allocated"], at_failure["reserved"], 0
            )
            report = replace(report, steps=(*steps, point))
    plot = write_plot(report, run_dir / PLOT_FILE) if report.steps else None
    return replace(report, plot=plot)


def _held(analysis: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """Bytes by role, summing to the allocator's reserved bytes on CUDA: its cache and what no
    recorded op made (allocated before the watch, or by a library) are roles too."""
    roles = dict(analysis.get("roles", {}))
    allocated, reserved = analysis.get("allocated"), analysis.get("reserved")
    if allocated is not None and reserved is not None and reserved != allocated:
        roles["untracked"] = max(0, allocated - sum(roles.values()))
        roles["allocator cache"] = max(0, reserved - allocated)
    return tuple((role, int(roles[role])) for role in ROLES if roles.get(role))


def _request(report: MemoryReport, failure: Failure, at_failure: dict[str, Any]) -> MemoryReport:
    message = failure.error.message
    requested = requested_bytes(message)
    total, free = device_figures(message)
    total = total or at_failure.get("device_total")
    free = free if free is not None else at_failure.get("device_free")
    aten = next((c for c in failure.cases if c.target.startswith("torch.ops.")), None)
    case = aten or (failure.cases[-1] if failure.cases else None)
    why = explain_request(failure.op, case, requested)
    alone = request_alone_too_big(requested, total, failure.device, cpu_allocator_refused(message))
    held = report.reserved_bytes or 0
    if alone:
        where = "the CPU allocator" if failure.device == "cpu" else "the whole device"
        why.append(
            f"the request alone ({format_bytes(requested)}) is more than {where} could give"
            + (f" ({format_bytes(total)} in all)" if total else "")
        )
    elif requested is not None:
        why.append(
            f"the request ({format_bytes(requested)}) failed because {format_bytes(held)} was "
            "already held"
            + (f" and {format_bytes(free)} was free" if free is not None else "")
            + (": see the leak below" if report.leak else "")
        )
    return replace(
        report,
        requested_bytes=requested,
        device_total_bytes=total,
        device_free_bytes=free,
        cause=CAUSE_REQUEST if alone else CAUSE_HELD,
        why=tuple(why),
        fragmentation=_fragmentation(
            requested, replace(report, device_free_bytes=free), at_failure
        ),
    )


def _fragmentation(
    requested: int | None, report: MemoryReport, at_failure: dict[str, Any]
) -> Fragmentation | None:
    """On CUDA: what the caching allocator held unallocated, its largest free block, and
    whether expandable segments would have helped (none on CPU: it has no cache)."""
    if report.device == "cpu" or report.reserved_bytes is None or report.allocated_bytes is None:
        return None
    return fragmentation(
        requested,
        cached=max(0, report.reserved_bytes - report.allocated_bytes),
        device_free=report.device_free_bytes,
        largest=at_failure.get("largest_free_block"),
        expandable=bool(at_failure.get("expandable_segments")),
    )


def fragmentation(
    requested: int | None,
    *,
    cached: int,
    device_free: int | None,
    largest: int | None,
    expandable: bool,
) -> Fragmentation:
    """Expandable segments help when the cache and the device's free memory together hold the
    request but no one block does: the cache is split, not short."""
    text = f"{format_bytes(cached)} reserved but unallocated"
    if largest is not None:
        text += f", the largest free block {format_bytes(largest)}"
    helps: bool | None = None
    if requested is not None and largest is not None:
        room = cached + (device_free or 0)
        helps = not expandable and room >= requested and largest < requested
        if expandable:
            text += ": expandable segments are on already"
        elif helps:
            text += (
                f": {format_bytes(room)} free in all but split; "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would have helped"
            )
        else:
            text += ": not enough for the request even as one block"
    return Fragmentation(cached, largest, helps, text)
