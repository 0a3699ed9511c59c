"""Every out-of-memory failure ends in a report, in bounded time, with the right phase: a
backward OOM inside a checkpointed block (both kinds of torch.utils.checkpoint), an OOM in a
checkpoint's recompute; no leak claimed without evidence; report.md carries the memory account
(the leak's retainer path; for a held-memory OOM, with no repro, the whole report).

The CPU allocator refuses an impossible request at once ("can't allocate memory: you tried to
allocate N bytes"), so these run in CI: each record is a real subprocess with a timeout, and a
hang fails the test."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from reprocut.localize.leak_text import leak_evidence
from reprocut.model.budget import Deadline, call_within
from reprocut.model.case import SourceLocation
from reprocut.model.memory import (
    CAUSE_HELD,
    HeldBy,
    Holder,
    MemoryReport,
    Skipped,
    StepMemory,
)
from reprocut.model.recording import ErrorInfo, Failure, RunDir
from reprocut.model.signature import classify
from reprocut.report.memory_plot import nice_ticks, render_svg

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "corpus" / "memory"
MIB, GIB = 1 << 20, 1 << 30
RECORD_LIMIT = 300  # seconds: a record past this is a hang (a loaded 2-core CI box takes ~60)


def _record(script: Path, *args: str, cwd: Path) -> tuple[dict[str, Any], float]:
    command = [sys.executable, "-m", "reprocut", "record", "--json", "--quiet", str(script), *args]
    started = time.monotonic()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=RECORD_LIMIT)
    return json.loads(done.stdout), time.monotonic() - started


def _marked(script: Path, marker: str = "# reprocut: culprit") -> int:
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def _memory_json(report: dict[str, Any]) -> dict[str, Any]:
    return json.loads((Path(report["run_dir"]) / "memory.json").read_text())


# --- a backward OOM inside a checkpointed block ----------------------------------------------


@pytest.mark.parametrize("kind", ["non-reentrant", "reentrant"])
def test_a_backward_oom_in_a_checkpointed_block_is_reported_with_its_forward_line(
    kind: str, tmp_path: Path
):
    """The gather's backward, run on the block's recomputed graph (reentrant) or the original
    one (non-reentrant), asks 149 GiB: phase backward, the gather's line, the report out."""
    script = CORPUS / "checkpoint_hard_negatives" / "train.py"
    args = ["--reentrant"] if kind == "reentrant" else []
    report, _ = _record(script, *args, cwd=tmp_path)
    assert (report["op"], report["step"], report["phase"]) == ("aten::new_zeros", 3, "backward")
    assert report["forward_source"]["line"] == _marked(script)
    memory = report["memory"]
    assert memory["phase"] == "backward" and memory["cause"] == "request"
    assert memory["requested_bytes"] == 200_000 * 200_000 * 4
    assert memory["why"][0] == "aten::new_zeros makes (200000, 200000) float32: 149.01 GiB"
    assert memory["skipped"] == [] and memory["leak"] is None
    failure = _memory_json(report)["failure"]
    # taken inside the failing op, before the error unwound: backward's gradients in flight
    # are still held, and what the checkpoint recomputed is known as such
    assert failure["taken"] == "where the allocation failed"
    assert failure["roles"]["backward temporaries"] >= 200_000 * 4
    assert failure["roles"]["recomputed for backward"] >= 200_000 * 4
    packed = failure["graphs"]["packed"]  # saved through checkpoint's hooks, never unpacked
    assert packed >= 1 if kind == "non-reentrant" else packed == 0


def test_an_oom_in_a_checkpoints_recompute_names_the_block(tmp_path: Path):
    """The block counts its forward calls; checkpointing's recompute is its 6th and takes the
    (n, n) branch: the phase is that recompute, with the block's function and line."""
    script = CORPUS / "checkpoint_stateful_block" / "train.py"
    report, _ = _record(script, cwd=tmp_path)
    assert (report["op"], report["step"], report["phase"]) == ("aten::mm", 2, "backward")
    assert report["source"]["line"] == _marked(script)  # the line inside the block
    assert "checkpoint(scorer" in report["forward_source"]["text"]  # the checkpoint's call
    block = _marked(script, "def forward(self, queries")
    assert report["memory"]["phase"] == (
        f"recompute of the checkpointed block `ScheduledNegatives.forward` at train.py:{block}, "
        "in backward"
    )
    assert report["memory"]["why"][0].startswith(
        "(250000, 16) @ (16, 250000) makes (250000, 250000) float32 pairwise scores: 232.83 GiB"
    )
    # the memory rerun keeps nothing of step 1 alive: one `queries` and one `docs` (16 MB each,
    # lines 39 and 40), as under plain python (the loop's frame once kept the last step's too)
    failure = _memory_json(report)["failure"]
    by_line: dict[int, int] = {}
    for holder in failure["top"]:
        by_line[holder["line"][1]] = by_line.get(holder["line"][1], 0) + holder["bytes"]
    queries, docs = _marked(script, "queries = encoder("), _marked(script, "docs = torch.randn(")
    assert by_line[queries] == 2 * 16_000_000  # the encoder's input and output
    assert by_line[docs] == 16_000_000
    assert failure["roles"]["other live tensors"] < 16_000_000


FULL_MATRIX_ADAGRAD = """\
import torch
from torch import nn


class FullMatrixAdagrad(torch.optim.Optimizer):
    def __init__(self, params, lr=0.01):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad.reshape(-1, 1)
                outer = g @ g.T  # reprocut: culprit
                state = self.state.setdefault(p, {})
                state["sum"] = state.get("sum", 0) + outer
                p -= group["lr"] * (state["sum"].diagonal().rsqrt() * g.squeeze(1)).view_as(p)


def main():
    torch.manual_seed(0)
    model = nn.Embedding(250_000, 1)
    optimizer = FullMatrixAdagrad(model.parameters())
    for step in range(3):
        loss = model(torch.randint(0, 250_000, (64,))).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

main()
"""


def test_an_oom_in_the_optimizer_step_says_so(tmp_path: Path):
    """Full-matrix AdaGrad forms an (n, n) preconditioner for an embedding of n = 250,000
    rows: the optimizer step asks 232.83 GiB."""
    script = tmp_path / "train.py"
    script.write_text(FULL_MATRIX_ADAGRAD)
    report, _ = _record(script, cwd=tmp_path)
    assert (report["op"], report["step"], report["phase"]) == ("aten::mm", 0, "optimizer")
    assert report["source"]["line"] == _marked(script)
    memory = report["memory"]
    assert memory["phase"] == "optimizer step" and memory["requested_bytes"] == 250_000**2 * 4
    assert memory["why"][0] == (
        "(250000, 1) @ (1, 250000) is an outer product: (250000, 250000) float32, 232.83 GiB, "
        "quadratic in the number of rows 250000"
    )
    assert memory["skipped"] == []


# --- no leak without evidence ----------------------------------------------------------------

TINY_GROWTH = """\
import torch

def main():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 1))
    optimizer = torch.optim.SGD([w], lr=1e-3)
    losses = []
    for step, n in enumerate([1000] * 8 + [250_000]):
        scores = torch.randn(n, 64) @ w  # (n, 1)
        labels = torch.randn(n)
        loss = (scores - labels).pow(2).mean()  # reprocut: culprit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())  # 4 bytes a step: real growth, nothing that matters

main()
"""


def test_a_flat_memory_run_that_fails_claims_no_leak(tmp_path: Path):
    """Memory carried from step to step grows by a 4-byte tensor each step, steadily: the old
    slope named it a leak ("`losses` keeps 4 B per step alive"); now it is flat, with the
    thresholds and the reason in --json."""
    script = tmp_path / "train.py"
    script.write_text(TINY_GROWTH)
    report, _ = _record(script, cwd=tmp_path)
    assert report["op"] == "aten::sub" and report["source"]["line"] == _marked(script)
    memory = report["memory"]
    assert memory["leak"] is None
    evidence = memory["evidence"]
    assert evidence["claimed"] is False and evidence["rising"] == evidence["intervals"] == 6
    assert evidence["bytes_per_step"] == 4
    assert evidence["min_bytes_per_step"] == MIB and evidence["min_device_share"] == 0.05
    assert evidence["reason"].startswith(
        "memory was flat: memory carried from step to step grew 4 B per step"
    )


def test_leak_evidence_needs_most_steps_up_and_an_amount_that_matters():
    def steps(carried: list[int]) -> tuple[StepMemory, ...]:
        return tuple(StepMemory(i + 1, 0, 0, c) for i, c in enumerate(carried))

    noise = [0, 1800, 400, 2600, 900, 3700, 1200, 4400]  # a slope of ~500 B/step, up and down
    flat = leak_evidence(steps(noise), 140 * GIB)
    assert flat is not None and not flat.claimed and (flat.rising, flat.falling) == (4, 3)
    leak = leak_evidence(steps([i * 8 * MIB for i in range(8)]), 24 * GIB)
    assert leak is not None and leak.claimed and leak.bytes_per_step == 8 * MIB
    assert leak.reason.startswith("memory carried from step to step rose at 7 of 7 steps")
    small = leak_evidence(steps([i * 2 * MIB for i in range(8)]), 140 * GIB)  # 2 GiB/1000 steps
    assert small is not None and not small.claimed
    assert small.reason.startswith("no leak claimed: memory carried from step to step grew 2.00")
    assert "1.95 GiB over 1000 steps, 1.4% of 140.00 GiB" in small.reason
    every_other = [0, 64 * MIB, 64 * MIB, 128 * MIB, 128 * MIB, 192 * MIB, 192 * MIB]
    validation = leak_evidence(steps(every_other), 24 * GIB)  # a validation pass each 2 steps
    assert validation is not None and validation.claimed and validation.rising == 3
    cache = [0, 4, 8, 12, 100 * MIB + 16, 100 * MIB + 20, 100 * MIB + 24]  # made once, kept
    once = leak_evidence(steps(cache), 24 * GIB)
    assert once is not None and not once.claimed and once.bytes_per_step == 4
    few = leak_evidence(steps([0, 8 * MIB, 16 * MIB]), 24 * GIB)
    assert few is not None and not few.claimed and few.reason.startswith("too few steps")


# --- report.md ------------------------------------------------------------------------------

LEAK_THEN_BROADCAST = """\
import torch
from torch import nn

def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 1024), nn.ReLU(), nn.Linear(1024, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    val_x = torch.randn(2048, 32)
    history = []
    for step, n in enumerate([256] * 8 + [250_000]):
        scores = model(torch.randn(n, 32))  # (n, 1)
        loss = (scores - torch.randn(n)).pow(2).mean()  # reprocut: culprit
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        val_loss = model(val_x).pow(2).mean()
        history.append(val_loss)  # keeps each validation graph: 8 MiB a step

main()
"""


def test_report_md_of_a_leaking_run_holds_the_retainer_path(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(LEAK_THEN_BROADCAST)
    report, _ = _record(script, cwd=tmp_path)
    leak = report["memory"]["leak"]
    assert leak is not None and leak["retainer"][0].startswith(
        "`history` (a list made at train.py:"
    )
    assert report["memory"]["cause"] == "request"
    command = [
        sys.executable,
        "-m",
        "reprocut",
        "shrink",
        "--json",
        "--runs",
        "1",
        report["run_dir"],
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RECORD_LIMIT)
    result = json.loads(done.stdout)
    assert result["status"] == "verified" and result["path"] == "empty-inputs", result
    text = Path(result["report"]).read_text()
    assert "## Out of memory" in text and "### Who held the memory" in text
    assert "- **Leak:** `history`, stored at train.py:" in text
    for step in leak["retainer"]:
        assert step in text
    assert "Fix: keep `.item()`" in text
    assert "[memory.svg](memory.svg)" in text
    assert "- memory carried from step to step rose at" in text


def _held_failure(script: Path) -> Failure:
    """An OOM that failed only because memory was held, as record writes one on a GPU (the
    CPU allocator refuses only requests that are too big alone, so CI cannot make one)."""
    message = (
        "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 139.80 "
        "GiB of which 512.00 MiB is free. Of the allocated memory 131.00 GiB is allocated by "
        "PyTorch, and 2.00 GiB is reserved by PyTorch but unallocated."
    )
    line = SourceLocation(str(script), 20, "hidden = torch.relu(self.up(x))")
    memory = MemoryReport(
        device="cuda:0",
        requested_bytes=GIB,
        device_total_bytes=int(139.8 * GIB),
        device_free_bytes=512 * MIB,
        cause=CAUSE_HELD,
        why=("aten::relu makes (16384, 16384) float32: 1.00 GiB",),
        allocated_bytes=131 * GIB,
        reserved_bytes=133 * GIB,
        held=(("parameters", GIB), ("saved for backward", 130 * GIB), ("allocator cache", 2 * GIB)),
        top=(Holder(line, "up", "aten::relu", 130 * GIB),),
        failing_step=3,
        phase="forward",
        held_by=HeldBy(
            130 * GIB,
            "`total_loss`, added to at train.py:40 keeps 130.00 GiB alive",
            ("`total_loss` (a Tensor made at train.py:35)", "its autograd graph"),
            "call `backward()` on each micro-batch's loss",
        ),
        skipped=(Skipped("the allocator snapshot", "did not finish within 12 s"),),
        plot="memory.svg",
    )
    return Failure(
        "localized",
        ErrorInfo("OutOfMemoryError", message),
        classify("OutOfMemoryError", message),
        op="aten::relu",
        step=3,
        phase="forward",
        source=line,
        device="cuda:0",
        memory=memory,
        script=str(script),
    )


def test_the_memory_report_with_its_evidence_and_skips_survives_json():
    from reprocut.model.memory import LeakEvidence

    memory = _held_failure(Path("/x/train.py")).memory
    assert memory is not None
    evidence = LeakEvidence(False, "memory was flat", 4, 6, 6, 0, 24 * GIB)
    memory = replace(memory, evidence=evidence, seconds=(("memory rerun", 12.5),))
    assert MemoryReport.from_json(json.loads(json.dumps(memory.to_json()))) == memory


def test_a_held_memory_oom_writes_report_md_and_exits_9(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    run_dir = RunDir.create(tmp_path / ".reprocut", "held")
    run_dir.write_failure(_held_failure(script))
    (run_dir.path / "memory.svg").write_text(render_svg(_held_failure(script).memory))
    command = [sys.executable, "-m", "reprocut", "shrink", "--json", str(run_dir.path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 9, done.stderr
    assert json.loads(done.stdout)["status"] == "memory-held"
    text = (run_dir.path / "report.md").read_text()
    assert text.startswith("# `aten::relu` raises OutOfMemoryError: out of memory")
    assert "> **No repro.py:** the request (1.00 GiB) alone fits the device; it failed " \
        "because 133.00 GiB was already held." in text  # fmt: skip
    assert "| saved for backward | 130.00 GiB | 98% |" in text
    assert "- **Held by:** `total_loss`" in text and "  Fix: call `backward()`" in text
    assert "- skipped: the allocator snapshot: did not finish within 12 s" in text
    assert "- phase: `forward`" in text and "## Environment" in text
    assert str(tmp_path) not in text  # paths relative to the script's folder
    out = tmp_path / "elsewhere"
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 9 and (out / "report.md").exists() and (out / "memory.svg").exists()


# --- the bounded stages and the picture -----------------------------------------------------


def test_a_stage_past_its_budget_is_skipped_and_the_caller_goes_on():
    started = time.monotonic()
    slow = call_within(0.2, lambda: time.sleep(5))
    assert slow.value is None and slow.skipped == "did not finish within 0.2 s"
    assert time.monotonic() - started < 2
    failed = call_within(1, lambda: 1 / 0)
    assert failed.skipped == "failed: ZeroDivisionError: division by zero"
    assert call_within(1, lambda: 42).value == 42


def test_the_graph_walk_never_runs_a_checkpoints_recompute():
    """Reading `_saved_*` of a node under non-reentrant checkpointing calls the unpack hook,
    which recomputes the whole block (once per read outside backward: on the H200, attention
    blocks of 36 GiB). The walk reads `_raw_saved_*.data` and counts what a hook packed."""
    from torch.utils.checkpoint import checkpoint

    from reprocut.record.inside.autograd_graph import Graphs

    calls = []

    def block(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x.sin().exp().cos()

    x = torch.randn(16, requires_grad=True)
    y = checkpoint(block, x.exp(), use_reentrant=False)
    graphs = Graphs()
    found = list(graphs.walk(y.grad_fn))
    assert len(calls) == 1  # the forward alone
    assert graphs.packed == 3 and graphs.unreadable == 0
    assert any(t.shape == (16,) for _, t in found)  # exp's saved result, outside the block
    reentrant = checkpoint(block, x.exp(), use_reentrant=True)
    ctx_found = [t for _, t in Graphs().walk(reentrant.grad_fn)]
    assert len(calls) == 2 and any(t.shape == (16,) for t in ctx_found)  # the block's input


def test_a_walk_stopped_by_its_deadline_says_so():
    from reprocut.record.inside.frames import UserFrames
    from reprocut.record.inside.retainers import analyse

    x = torch.randn(8, requires_grad=True)
    chain = x
    for _ in range(600):
        chain = chain.exp().log()
    expired = Deadline(0.0)
    result = analyse({}, UserFrames(), [], 1, expired, at_failure=True)
    assert result["graphs"]["stopped"] is True
    assert result["skipped"][0]["stage"] == "the walk of the autograd graphs"
    assert chain is not None


def test_ticks_are_round_numbers_of_one_unit():
    ticks, unit, size = nice_ticks(139.8 * GIB)
    assert (unit, [t / size for t in ticks]) == ("GiB", [0, 32, 64, 96, 128, 160])
    ticks, unit, size = nice_ticks(3 * MIB)
    assert (unit, [t / size for t in ticks]) == ("MiB", [0, 1, 2, 3])


def test_the_picture_draws_the_request_against_the_device_and_no_unmeasured_point():
    report = MemoryReport(
        device="cuda",
        requested_bytes=48 * GIB,
        device_total_bytes=int(139.8 * GIB),
        allocated_bytes=96 * GIB,
        steps=(
            StepMemory(0, 2 * GIB, 4 * GIB, 0),
            StepMemory(1, 3 * GIB, 6 * GIB, 0),
            StepMemory(2, 96 * GIB, 99 * GIB, None),  # at the failure: carried not measured
        ),
        failing_step=2,
    )
    svg = render_svg(report)
    assert ">128 GiB</text>" in svg and ">160 GiB</text>" in svg and "device: 139.80 GiB" in svg
    assert "step 2: out of memory, 48.00 GiB asked on top of 96.00 GiB allocated" in svg
    assert "<title>asked 48.00 GiB</title>" in svg
    carried = next(line for line in svg.splitlines() if "<title>carried</title>" in line)
    assert carried.count(",") == 2  # steps 0 and 1: nothing drawn where nothing was measured
    huge = render_svg(MemoryReport(device="cuda", requested_bytes=232 * GIB,
                                   device_total_bytes=int(139.8 * GIB), allocated_bytes=GIB,
                                   steps=(StepMemory(0, GIB, GIB, 0),), failing_step=1))  # fmt: skip
    assert "232.00 GiB asked (off the chart)" in huge and ">160 GiB</text>" in huge


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_oom_is_taken_with_the_allocators_own_figures(tmp_path: Path):
    """Taken inside the op that raised: allocated is what the error itself says PyTorch had
    allocated, and the snapshot is of that moment."""
    import re

    from reprocut.record.inside.frames import UserFrames
    from reprocut.record.inside.memory import SNAPSHOT_FILE, MemoryWatch
    from reprocut.record.inside.state import RunState

    held = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    watch = MemoryWatch(RunState(), UserFrames(), tmp_path, cuda_history=True).start()
    try:
        with pytest.raises(torch.OutOfMemoryError) as raised:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
    finally:
        watch.stop()
        torch.cuda.memory._record_memory_history(enabled=None)
    failure = watch.failure
    assert failure is not None and failure["taken"] == "where the allocation failed"
    assert failure["op"] == "aten::empty" and failure["phase"] == "forward"
    said = re.search(r"Of the allocated memory ([\d.]+) GiB is allocated", str(raised.value))
    assert said is not None and abs(float(said.group(1)) * GIB - failure["allocated"]) < 0.01 * GIB
    assert failure["allocated"] >= held.numel() and failure["device_total"] > failure["device_free"]
    assert failure["snapshot"] == SNAPSHOT_FILE and (tmp_path / SNAPSHOT_FILE).exists()
    assert failure["skipped"] == []


def test_a_repro_of_a_recompute_oom_says_which_block_and_line():
    from reprocut.pipeline.request_repro import header_notes

    failure = _held_failure(Path("/x/train.py"))
    assert failure.memory is not None
    phase = "recompute of the checkpointed block `ScheduledNegatives.forward` at train.py:21"
    source = SourceLocation("/x/train.py", 27, "return q @ docs.T  # reprocut: culprit")
    failure = replace(failure, phase="backward", source=source,
                      memory=replace(failure.memory, phase=f"{phase}, in backward"))  # fmt: skip
    assert header_notes(failure)[1] == (
        f"Phase: {phase}, in backward; the line: `return q @ docs.T` (train.py:27)"
    )


def test_a_cublas_workspace_failure_without_captured_inputs_is_on_cuda_with_its_fragmentation():
    """cuBLAS's own allocation failed with 138.71 GiB held: no input was captured (too big to
    keep), and the device fell back to "cpu", which dropped the allocator's fragmentation."""
    from reprocut.localize.culprit import _device_of
    from reprocut.localize.memory import build_report

    message = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    assert _device_of([], {"type": "RuntimeError", "message": message}) == "cuda"
    assert _device_of([], {"type": "IndexError", "message": "index out of range"}) == "cpu"
    failure = replace(
        _held_failure(Path("/x/train.py")),
        error=ErrorInfo("RuntimeError", message),
        signature=classify("RuntimeError", message),
        memory=None,
        device="cuda",
    )
    held, cache = 148_920_995_840, 18_739_200
    data = {"failure": {"step": 0, "allocated": held, "reserved": held + cache,
                        "device_free": 59 << 20, "roles": {"other live tensors": held}}}  # fmt: skip
    report = build_report(failure, data, Path("/x"))
    assert report.fragmentation is not None
    assert report.fragmentation.text.startswith("17.87 MiB reserved but unallocated")


def test_a_cublas_failure_no_op_owned_is_localized_by_the_watch_on_cuda():
    """No op owned cuBLAS's failure in the rerun either (it reads as a CUDA error): the failure
    starts as a script error, read as "cpu", and the memory watch names the op. It is then on
    the device its error names, with the allocator's fragmentation (H200 memory stage)."""
    from reprocut.localize.memory import build_report, with_watch_facts

    message = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    failure = Failure("script-error", ErrorInfo("RuntimeError", message),
                      classify("RuntimeError", message), step=0)  # fmt: skip
    assert failure.device == "cpu"
    held, cache = 148_920_995_840, 18_739_200
    at_failure = {"step": 0, "allocated": held, "reserved": held + cache, "op": "aten::addmm",
                  "phase": "forward", "taken": "where the allocation failed",
                  "device_free": 59 << 20, "roles": {"other live tensors": held}}  # fmt: skip
    localized = with_watch_facts(failure, at_failure)
    assert (localized.status, localized.op, localized.device) == (
        "localized",
        "aten::addmm",
        "cuda",
    )
    report = build_report(localized, {"failure": at_failure}, Path("/x"))
    assert report.fragmentation is not None
    assert report.fragmentation.text.startswith("17.87 MiB reserved but unallocated")


def test_a_rerun_whose_allocator_held_another_amount_says_so():
    """The memory rerun read 169.08 MiB at a recompute's failure where the failing run's error
    said 140.71 MiB: the report names both, and whose the holders are."""
    from reprocut.localize.memory import build_report

    message = (
        "CUDA out of memory. Tried to allocate 232.83 GiB. GPU 0 has a total capacity of 139.80 "
        "GiB of which 138.89 GiB is free. Of the allocated memory 140.71 MiB is allocated by "
        "PyTorch, and 41.29 MiB is reserved by PyTorch but unallocated."
    )
    failure = replace(_held_failure(Path("/x/train.py")), error=ErrorInfo("OutOfMemoryError", message), memory=None)  # fmt: skip
    at = {"step": 2, "allocated": 177_290_240, "reserved": 255_852_544}
    notes = build_report(failure, {"failure": at}, Path("/x")).notes
    assert notes == (
        "the memory rerun had 169.08 MiB allocated at the failure where the failing run's error "
        "says 140.71 MiB: the holders are the rerun's",
    )
    agreeing = {**at, "allocated": int(140.71 * (1 << 20))}
    assert build_report(failure, {"failure": agreeing}, Path("/x")).notes == ()
