"""An out-of-memory failure's MemoryReport: a rerun to the failing step under the memory watch.

The allocator raises at the op that asks, synchronously, so the first run already names the
op; what it cannot say is who held the memory and why the request is that big. One rerun with
the memory watch on (record/inside/memory.py: every storage's maker, memory per step, the
holders and the leak's retainer where the allocation failed, the allocator snapshot on CUDA)
answers that; `record --memory` runs had it on already. An OOM in a light step (where no op
was watched) gets its culprit from the same rerun, every step recorded.

Every stage after the failure is bounded, so every OOM ends in a report: the rerun by a
timeout set from the first run's time, the child's walk and snapshot by their own budgets
(memory_failure.py), the request's explanation and the picture here. A stage that does not
finish is listed in the report as skipped, with its reason.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
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
from reprocut.localize.leak_text import held_by_of, holders, leak_evidence, leak_of, short
from reprocut.localize.oom_why import explain_request, library_alloc_why, request_alone_too_big
from reprocut.localize.rerun import rerun_limit
from reprocut.model.budget import call_within
from reprocut.model.memory import (
    CAUSE_HELD,
    CAUSE_REQUEST,
    ROLES,
    Fragmentation,
    MemoryReport,
    Skipped,
    StepMemory,
)
from reprocut.model.oom import (
    allocated_in_message,
    cpu_allocator_refused,
    device_figures,
    figures_agree,
    format_bytes,
    is_out_of_memory,
    requested_bytes,
)
from reprocut.model.recording import Failure, RunDir
from reprocut.model.signature import device_in_words
from reprocut.record.inside.memory import MEMORY_FILE
from reprocut.record.parent.runner import RunRequest, RunResult, run_script
from reprocut.report.memory_plot import PLOT_FILE, write_plot

REQUEST_SECONDS = 10.0  # the failing op run again on the meta device, to say why it asked so much
PLOT_SECONDS = 5.0


def is_oom_failure(failure: Failure) -> bool:
    return is_out_of_memory(failure.error.type, failure.error.message)


def is_oom_outcome(outcome: dict[str, Any] | None) -> bool:
    error = (outcome or {}).get("error")
    return bool(error) and is_out_of_memory(error["type"], error["message"])


def warm_meta_kernels() -> None:
    """Import what the failing op's run on the meta device needs, beside the memory rerun: an
    elementwise op's meta kernel is a Python reference that imports torch._dynamo on its first
    call (4.5 s on the 2-core CPU machine, past REQUEST_SECONDS under load), which the parent
    would otherwise pay inside the request's explanation, after the rerun or the read of the
    memory watch's findings."""
    threading.Thread(
        target=importlib.import_module, args=("torch._dynamo",), name="reprocut-warm", daemon=True
    ).start()


def memory_rerun(
    options: LocalizeOptions, progress: Progress, why: str, first_seconds: float | None
) -> tuple[RunResult, list[Skipped], list[tuple[str, float]]]:
    """The rerun under the memory watch, within rerun_limit; a rerun cut off is a skip."""
    limit = rerun_limit(options.timeout, first_seconds)
    progress(f"{why}; rerunning with the memory watch on (who made each tensor, what holds it)")
    result = run_script(
        RunRequest(
            options.script,
            options.argv,
            options.run_dir.path,
            "memory",
            snapshots=False,
            light_steps=False,
            memory=True,
            timeout=limit,
            cwd=options.cwd,
            launch=options.launch,
        )
    )
    skipped = []
    if result.timed_out:
        skipped.append(
            Skipped("the memory rerun", f"did not end within {limit:g} s and was stopped")
        )
    return result, skipped, [("memory rerun", round(result.seconds, 3))]


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
    """No op owned the allocation failure in the first run (it failed in a step not watched,
    or reads as a CUDA error, as cuBLAS's does): one rerun names it and the holders."""
    warm_meta_kernels()
    second, skipped, seconds = memory_rerun(
        options,
        progress,
        f"out of memory at step {outcome['step']}, in a step not watched",
        first.seconds,
    )
    culprit = (second.outcome or {}).get("culprit")
    if names_op(culprit):
        failure = from_culprit(options, first, outcome, culprit, second, "rerun")
    else:
        failure = script_error(options, first, error_info(outcome["error"], first.stderr), outcome)
    return attach(options, failure, read_memory(options.run_dir), skipped, seconds)


def with_memory(
    options: LocalizeOptions,
    failure: Failure,
    progress: Progress,
    first_seconds: float | None = None,
) -> Failure:
    """`failure` (an OOM) with its MemoryReport: from this run's memory watch, or a rerun."""
    warm_meta_kernels()
    data = read_memory(options.run_dir) if options.memory else {}
    skipped: list[Skipped] = []
    seconds: list[tuple[str, float]] = []
    if not data.get("failure"):
        rerun, skipped, seconds = memory_rerun(
            options, progress, f"out of memory in {failure.op or 'the script'}", first_seconds
        )
        data = read_memory(options.run_dir)
        failure = with_forward_line(failure, (rerun.outcome or {}).get("culprit"))
    return attach(options, failure, data, skipped, seconds)


def with_forward_line(failure: Failure, culprit: dict[str, Any] | None) -> Failure:
    """A backward op's forward line from the rerun's culprit: on a GPU the first run tags
    autograd nodes only in the steps it watches every public call, the rerun in every step."""
    if failure.phase != "backward" or failure.forward_source is not None or not culprit:
        return failure
    forward = location(culprit.get("forward_source"))
    if forward is None or culprit.get("op") != failure.op:
        return failure
    return replace(failure, forward_source=forward, source=failure.source or forward)


def with_watch_facts(failure: Failure, at_failure: dict[str, Any]) -> Failure:
    """What the memory watch saw inside the failing op, where the failure lacks it: the op (a
    cuBLAS allocation failure reads as a CUDA error, which no op owns before localization),
    its lines, and the phase: the op raised on autograd's thread, where the script's own
    frame, which the outcome's phase comes from, was still in `backward()`."""
    op = at_failure.get("op")
    if not op or at_failure.get("taken") != "where the allocation failed":
        return failure
    if failure.op not in (None, op):
        return failure
    if failure.status == "script-error":  # the watch saw the op raise: it is localized
        notes = tuple(n for n in failure.notes if "not inside a torch op" not in n)
        # on the device the error names (a script error is read as "cpu"; a cuBLAS failure on
        # cpu would lose the allocator's figures, fragmentation among them)
        device = device_in_words(failure.error.type, failure.error.message)
        failure = replace(failure, status="localized", localization="memory watch", notes=notes,
                          device=device)  # fmt: skip
    phase = "backward" if at_failure.get("phase") == "recompute" else at_failure.get("phase")
    source, forward = (
        _location(at_failure.get("source")),
        _location(at_failure.get("forward_source")),
    )
    return replace(
        failure,
        op=op,
        phase=phase or failure.phase,
        step=failure.step if failure.step is not None else at_failure.get("step"),
        source=failure.source or source or forward,
        forward_source=failure.forward_source or (forward if phase == "backward" else None),
        module=failure.module or at_failure.get("module"),
    )


def _location(pair: Any) -> Any:
    return None if not pair else location({"file": pair[0], "line": pair[1]})


def attach(
    options: LocalizeOptions,
    failure: Failure,
    data: dict[str, Any],
    skipped: list[Skipped] | None = None,
    seconds: list[tuple[str, float]] | None = None,
) -> Failure:
    failure = with_watch_facts(failure, data.get("failure") or {})
    report = build_report(
        failure, data, options.run_dir.path, skipped=skipped or (), seconds=seconds or ()
    )
    failure = replace(failure, memory=report)
    options.run_dir.write_failure(failure)
    return failure


def build_report(
    failure: Failure | None,
    data: dict[str, Any],
    run_dir: Any,
    *,
    skipped: Any = (),
    seconds: Any = (),
) -> MemoryReport:
    """The MemoryReport from the memory watch's findings (and the failure, if any)."""
    started = time.monotonic()
    steps = tuple(StepMemory.from_json(s) for s in data.get("steps", ()))
    at_failure = data.get("failure") or {}
    analysis = at_failure or data.get("analysis") or {}
    device = failure.device if failure is not None else data.get("device", "cpu")
    evidence = leak_evidence(steps, _device_bytes(device, failure, at_failure, data))
    skips = [*skipped, *(Skipped.from_json(s) for s in analysis.get("skipped", ()))]
    report = MemoryReport(
        device=device,
        steps=steps,
        growth_per_step_bytes=None if evidence is None else evidence.bytes_per_step,
        evidence=evidence,
        top=holders(analysis.get("top", [])),
        leak=leak_of(analysis, evidence),
        failing_step=at_failure.get("step") if failure is not None else None,
        phase=phase_text(failure, at_failure),
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
        report = replace(report, notes=(*report.notes, *_rerun_differs(report, failure)))
        report, skip = _request(report, failure, at_failure)
        skips.extend(skip)
        if report.cause == CAUSE_HELD and report.leak is None:  # who keeps what was held
            report = replace(report, held_by=held_by_of(at_failure))
        if at_failure.get("allocated") is not None:  # the failing step's point in the picture
            point = StepMemory(
                at_failure["step"],
                at_failure["allocated"],
                at_failure["reserved"],
                at_failure.get("carried"),  # None from a watch that did not measure it
            )
            report = replace(report, steps=(*steps, point))
    plot = None
    if report.steps:
        drawn = call_within(PLOT_SECONDS, lambda: write_plot(report, run_dir / PLOT_FILE))
        plot = drawn.value
        if drawn.skipped:
            skips.append(Skipped("the picture", drawn.skipped))
    watch_seconds = tuple((f"{k} (in the rerun)", float(v)) for k, v in
                          (at_failure.get("seconds") or {}).items())  # fmt: skip
    spent = (("report", round(time.monotonic() - started, 3)),)
    return replace(
        report,
        plot=plot,
        skipped=tuple(skips),
        seconds=(*tuple(seconds), *watch_seconds, *spent),
    )


def phase_text(failure: Failure | None, at_failure: dict[str, Any]) -> str | None:
    """The phase in words: a checkpoint's recompute names its block, an optimizer step says so."""
    phase = at_failure.get("phase") or (failure.phase if failure is not None else None)
    if phase == "recompute":
        block = at_failure.get("recompute")
        if not block:
            return "recompute of a checkpointed block, in backward"
        where = short(location({"file": block["file"], "line": block["line"]}))
        return f"recompute of the checkpointed block `{block['function']}` at {where}, in backward"
    if phase == "optimizer":
        return "optimizer step"
    return phase


def _device_bytes(
    device: str, failure: Failure | None, at_failure: dict[str, Any], data: dict[str, Any]
) -> int | None:
    """The memory a leak would fill: the GPU's, or on the CPU the machine's."""
    if device.startswith("cpu"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    total = device_figures(failure.error.message)[0] if failure is not None else None
    return total or at_failure.get("device_total") or data.get("device_total")


def _rerun_differs(report: MemoryReport, failure: Failure) -> tuple[str, ...]:
    """The memory rerun's figures are read in a second run; where its allocator held another
    amount at the failure than the failing run's own message says, the report says so (the
    holders are the rerun's) instead of printing one figure as both."""
    said = allocated_in_message(failure.error.message)
    read = report.allocated_bytes
    if said is None or read is None or figures_agree(said, read):
        return ()
    return (
        f"the memory rerun had {format_bytes(read)} allocated at the failure where the failing "
        f"run's error says {format_bytes(said)}: the holders are the rerun's",
    )


def _held(analysis: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """Bytes by role, summing to the allocator's reserved bytes on CUDA: its cache and what no
    recorded op made (allocated before the watch, or by a library) are roles too."""
    roles = dict(analysis.get("roles", {}))
    allocated, reserved = analysis.get("allocated"), analysis.get("reserved")
    if allocated is not None and reserved is not None and reserved != allocated:
        roles["untracked"] = max(0, allocated - sum(roles.values()))
        roles["allocator cache"] = max(0, reserved - allocated)
    return tuple((role, int(roles[role])) for role in ROLES if roles.get(role))


def _request(
    report: MemoryReport, failure: Failure, at_failure: dict[str, Any]
) -> tuple[MemoryReport, list[Skipped]]:
    message = failure.error.message
    requested = requested_bytes(message)
    total, free = device_figures(message)
    total = total or at_failure.get("device_total")
    free = free if free is not None else at_failure.get("device_free")
    aten = next((c for c in failure.cases if c.target.startswith("torch.ops.")), None)
    case = aten or (failure.cases[-1] if failure.cases else None)
    skipped = []
    explained = call_within(REQUEST_SECONDS, lambda: explain_request(failure.op, case, requested))
    why = list(explained.value or ())
    if explained.skipped:
        skipped.append(Skipped("why the request is that big (the op on the meta device)",
                               explained.skipped))  # fmt: skip
    alone = request_alone_too_big(requested, total, failure.device, cpu_allocator_refused(message))
    held = report.reserved_bytes or 0
    library = library_alloc_why(message, free, held)
    if library:
        why.append(library)
    elif alone:
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
    report = replace(
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
    return report, skipped


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
