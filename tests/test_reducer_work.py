"""benchmarks/bench_reducer_work.py: the reducer's own work, replayed from the H200's bests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from benchmarks.bench_reducer_work import REPLAYS, extract, replay

BEST = """\
import torch

def kernel(grid, block, args):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")

ids = torch.randint(0, 1 << 20, (64,), device="cuda")
out = torch.empty(64, 16, device="cuda")
kernel((64,), (16,), (ids.data_ptr(), out.data_ptr(), 1000))
"""


def test_a_check_log_becomes_a_replay_that_makes_and_judges_the_same_candidates(
    tmp_path: Path,
) -> None:
    focus = "kernel((64,), (16,), (ids.data_ptr(), out.data_ptr(), 1000))"
    rows = [
        {"kind": "rules", "reducer": "source", "focus": focus, "memory_fault": True},
        {"kind": "accepted", "reducer": "source", "code": BEST},
        {"kind": "check", "code": "print()"},
        {"kind": "accepted", "reducer": "source", "code": BEST.replace("1000", "1")},
    ]
    log = tmp_path / "cuda_case.shrink.checks.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    op_level = tmp_path / "op_case.shrink.checks.jsonl"
    op_level.write_text(json.dumps({"kind": "accepted", "reducer": "case"}) + "\n")
    data = extract([log, op_level], "abc1234")
    assert list(data["cases"]) == ["cuda_case"]  # an op-level shrink reduced no script
    case = data["cases"]["cuda_case"]
    assert len(case["bests"]) == 2 and case["focus"] == focus
    first, again = replay(case), replay(case)
    assert first["bests"] == 2 and 0 < first["admitted"] < first["candidates"]
    assert first["digest"] == again["digest"]  # the same candidates, the same answers
    other = replay({**case, "bests": case["bests"][:1]})
    assert other["digest"] != first["digest"]


def test_the_committed_replay_holds_the_h200s_script_reductions() -> None:
    data = json.loads(gzip.decompress(REPLAYS.read_bytes()))
    assert "cuda_triton_expand_bias" in data["cases"]
    assert all(len(case["bests"]) > 5 for case in data["cases"].values())


def test_the_check_log_summary_says_how_long_no_check_was_in_flight() -> None:
    """benchmarks/check_log_summary.py: the reduction's seconds less the union of its checks'
    spans (overlapping checks counted once, the gaps before, between and after them idle)."""
    from benchmarks.check_log_summary import markdown, summarize

    events = [
        {"t": 10.0, "kind": "pass", "pass_name": "delete_statements"},
        {"t": 13.0, "kind": "check", "seconds": 2.0, "verdict": "Passed"},  # 11-13
        {"t": 14.0, "kind": "check", "seconds": 2.5, "verdict": "Reproduced"},  # 11.5-14
        {"t": 15.0, "kind": "pass", "pass_name": "shrink_integers"},
        {"t": 18.0, "kind": "check", "seconds": 1.0, "verdict": "Passed"},  # 17-18
        {"t": 20.0, "kind": "phase", "phase": "source_reduce", "seconds": 10.0},
    ]
    summary = summarize(events)
    assert summary.reduction == 10.0
    assert abs(summary.idle - (1.0 + 3.0 + 2.0)) < 1e-9  # 10-11, 14-17, 18-20
    assert "no check in flight for 6.0 s of the reduction's 10.0 s" in markdown("x", summary)
