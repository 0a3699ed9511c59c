"""benchmarks/last_round.py: the last round of a reduction, counted on the H200's fixed points."""

from __future__ import annotations

from benchmarks.last_round import count, reduced_code, script_cases


def test_the_script_cases_and_their_last_rounds_are_read_from_the_committed_repros():
    cases = script_cases()
    assert "cuda_cupy_hashed_ids" in cases and "cuda_triton_op_guarded" not in cases
    code = reduced_code("cuda_cupy_hashed_ids")
    assert code.startswith("import torch") and '"""' not in code.splitlines()[0]
    counts = count("cuda_cupy_hashed_ids")
    assert counts is not None and all(n > 0 for n in counts.values())
    assert count("cuda_extension_pad_rows") is None  # an extension's op: no launch to read
