"""benchmarks/bench_faults.py, the H200 benchmark of issue #11, checked before a GPU call is spent
on it: its cases exist with a CUDA signature, and its table shows what shrink attached."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_faults import CASES, count_code_lines, shrink_command, source_case  # noqa: E402
from benchmarks.corpus_cases import CORPUS, load_case  # noqa: E402
from benchmarks.corpus_score import CaseScore  # noqa: E402
from benchmarks.faults_table import (  # noqa: E402
    FaultRow,
    Reduced,
    matches_truth,
    previous_result,
    render,
    repros_folder,
    write,
)


def test_every_case_runs_on_cuda_with_the_signature_its_repros_are_checked_against():
    for name in CASES:
        case = load_case(CORPUS / name)
        assert case.applies_to("cuda") and (case.kernel or case.op), name
        source = source_case(case, "cuda")
        assert source is not None and source.argv[-2:] == ("--device", "cuda"), name
        assert source.expected.kind == case.truth("cuda").kind
        assert case.fingerprint, name  # every one is a memory fault: the same bug is checked
    assert len(CASES) == 11
    command = shrink_command("run", Path("out"), None)
    assert "--max-time" not in command and "--timeout" not in command  # shrink's defaults


def score(case: str, **checks: object) -> CaseScore:
    right = dict(outcome=True, op=True, line=True, step=True, signature=True, facts=True)
    return CaseScore(case, "cuda", "fail", **{**right, **checks})  # type: ignore[arg-type]


def test_the_table_shows_verified_same_bug_truth_and_the_median_shrink_time():
    found = {"status": "found", "findings": ["Invalid __global__ read of size 4 bytes in hashed_bag",
                                             "thread (3,0,0) in block (0,0,0): 128.0 TiB past `table`"]}  # fmt: skip
    original = {"kernel": "hashed_bag", "access": "read", "relation": "past the end of",
                "accesses": ["read"]}  # fmt: skip
    same = {"equal": True, "original": original, "differ": [], "skipped": []}
    slid = {"equal": False, "differ": ["access"], "note": "", "skipped": []}
    limits = {"max_time": 30.0, "max_checks": 500}
    expected = load_case(CORPUS / "cuda_cupy_hashed_ids").fingerprint
    rows = [
        FaultRow(
            "cuda_cupy_hashed_ids",
            "ids",
            score("cuda_cupy_hashed_ids", statements=9),
            Reduced(
                40.0, 9.5, 12, 21, 14, True, "verified", "3/3", found, same, "fixed point", limits
            ),
            truth=matches_truth(expected, original),
        ),
        FaultRow(
            "cuda_cupy_contiguous_pe",
            "pe",
            score("cuda_cupy_contiguous_pe"),
            Reduced(
                70.0, 30.2, 40, 15, 9, True, "verified", "3/3", found, slid, "max time", limits
            ),
        ),
    ]
    meta = {"device": "cuda", "date": "2026-12-01", "command": "bench", "max_time": None,
            "check_timeout": 30, "device_name": "H200"}  # fmt: skip
    table = render(rows, meta)
    (hashed,) = [line for line in table.splitlines() if line.startswith("| cuda_cupy_hashed")]
    assert (
        "| ✓ | ✓ (3/3) | ✓ | ✓ | 40.0 | 9.5 | fixed point | 12 | 21 (9) | 14 | ✓ Invalid" in hashed
    )
    (pe,) = [line for line in table.splitlines() if line.startswith("| cuda_cupy_contiguous")]
    assert "| ✓ (3/3) | ✗ (access) | · | 70.0 | 30.2 | max time |" in pe
    assert "at its default settings" in table and '"max_time": 30.0' in table
    assert (
        "**Median shrink time 55.0 s (reduction alone 19.9 s), median repro 18.0 lines; "
        "verified and the same bug: 1/2**" in table
    )
    assert matches_truth(expected, {**original, "relation": "before the start of"}) is True
    assert matches_truth(expected, {**original, "relation": "misaligned inside"}) is False
    assert matches_truth(expected, {**original, "accesses": ["write"]}) is False


def test_code_lines_leave_out_the_header_only():
    code = '"""Minimal reproduction.\n\nExpected: ...\n"""\n\nimport torch\n\n\nx = "a"\n"""not a docstring"""\n'
    assert count_code_lines(code) == 3
    assert count_code_lines("import torch\ntorch.ones(1)\n") == 2
    assert count_code_lines("def (:\n") is None


def test_results_keep_one_name_per_device_and_a_rerun_overwrites(tmp_path):
    meta = {"device": "cuda", "date": "2026-12-01", "command": "bench", "max_time": 30,
            "check_timeout": 30, "jobs": 4}  # fmt: skip
    row = FaultRow("gnn_sparse_adjacency", "sparse", score("gnn_sparse_adjacency"),
                   Reduced(seconds=60.0, lines=9))  # fmt: skip
    first = write([row], meta, tmp_path)
    faster = replace(row, reprocut=Reduced(seconds=40.0, lines=12))  # faster, but larger
    second = write([faster], {**meta, "date": "2026-12-02"}, tmp_path)
    assert first == second == tmp_path / "faults-cuda.md"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faults-cuda.json", "faults-cuda.md"]
    text = second.read_text()
    assert "2026-12-02" in text and "shrinks 4 at once" in text and "`faults-cuda-repros/`" in text
    assert "1 repro(s) larger" in text
    assert "| gnn_sparse_adjacency / reprocut | 9 | 12 | 60.0 | 40.0 | **larger** |" in text
    assert repros_folder(tmp_path, "cuda") == tmp_path / "faults-cuda-repros"
    # a run that writes its partial table as each case ends compares its final one with the
    # result from before it, read first, not with its own partial table
    before = previous_result(tmp_path, "cuda")
    write([row], {**meta, "date": "2026-12-03", "incomplete": "1 of 2 cases"}, tmp_path, before)
    final = write([row], {**meta, "date": "2026-12-03"}, tmp_path, before).read_text()
    assert "| gnn_sparse_adjacency / reprocut | 12 | 9 | 40.0 | 60.0 |" in final


def test_truth_may_list_the_access_kinds_a_bug_makes():
    """int32 offsets wrap in the loads and the stores alike: either may be printed first."""
    expected = load_case(CORPUS / "cuda_triton_int32_offsets").fingerprint
    printed = {"kernel": "scale_logits_kernel", "relation": "before the start of"}
    assert matches_truth(expected, {**printed, "access": "write", "accesses": ["write"]})
    assert matches_truth(expected, {**printed, "access": "read"})
    assert not matches_truth(expected, {**printed, "access": "atomic"})
