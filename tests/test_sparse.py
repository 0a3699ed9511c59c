"""Sparse COO/CSR tensors keep their layout and indices (capture, JSON, emit, shrink, repro),
and a tensor too large to store stays a spec that the shrinker cuts only as far as it fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reprocut.check.verify import signature_from_stderr
from reprocut.cli import main
from reprocut.model.case import (
    Captured,
    Generated,
    Literal,
    ReproCase,
    TensorSpec,
    arg_from_json,
    arg_to_json,
    spec_from_json,
)
from reprocut.model.recording import RunDir
from reprocut.model.tensors import materialize, spec_of
from reprocut.record.inside.capture import MAX_CAPTURED_ELEMENTS, TensorStore, hold_call
from reprocut.shrink.emitter import emit
from reprocut.shrink.passes import PASSES, shrink_dimensions
from reprocut.shrink.shrinker import Shrinker
from reprocut.shrink.sparse_passes import coordinates, cut_sparse_to_offender

SCRIPTS = Path(__file__).parent / "scripts"


def coo(indices: list[list[int]], size: tuple[int, int], values: list[float]) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values), size)


# --- the data model --------------------------------------------------------------------------


def test_sparse_spec_round_trips_and_old_json_still_loads() -> None:
    spec = spec_of(coo([[0, 1], [2, 9]], (3, 4), [1.0, 2.0]))
    assert spec.layout == "sparse_coo" and spec.coalesced is False
    assert [part.shape for part in spec.parts] == [(2, 2), (2,)]
    assert arg_from_json(json.loads(json.dumps(arg_to_json(spec)))) == spec
    old = {"shape": [2, 3], "stride": None, "dtype": "float32", "values": {"captured": "t0"}}
    loaded = spec_from_json(old)
    assert loaded.layout == "strided" and loaded.parts == () and loaded.values == Captured("t0")
    dense = {"shape": [2], "stride": None, "storage_offset": 0, "dtype": "float32",
             "device": "cpu", "requires_grad": False, "values": {"literal": [1.0, 2.0]}}  # fmt: skip
    assert arg_to_json(spec_from_json(dense)) == {"tensor": dense}  # dense JSON is unchanged


def test_capture_keeps_indices_and_materialize_rebuilds_both_layouts() -> None:
    store = TensorStore()
    bad_coo = coo([[0, 2, 1], [1, 7, 0]], (3, 4), [1.0, 2.0, 3.0])
    crow, col = torch.tensor([0, 1, 1, 3]), torch.tensor([2, 9, 0])
    bad_csr = torch.sparse_csr_tensor(crow, col, torch.tensor([1.0, 2.0, 3.0]), (3, 4))
    call = hold_call((bad_coo, bad_csr), {}, "aten::mm", store, everything=True)
    coo_spec, csr_spec = (arg_from_json(arg) for arg in call.to_json()["args"])
    assert isinstance(coo_spec, TensorSpec) and isinstance(csr_spec, TensorSpec)
    assert (coo_spec.layout, csr_spec.layout) == ("sparse_coo", "sparse_csr")
    assert all(isinstance(part.values, Captured) for part in (*coo_spec.parts, *csr_spec.parts))
    rebuilt = materialize(coo_spec, store.tensors)
    assert rebuilt.layout == torch.sparse_coo and rebuilt._indices().tolist() == [
        [0, 2, 1],
        [1, 7, 0],
    ]
    rebuilt_csr = materialize(csr_spec, store.tensors)
    assert rebuilt_csr.layout == torch.sparse_csr
    assert rebuilt_csr.col_indices().tolist() == [2, 9, 0]
    assert rebuilt_csr.crow_indices().tolist() == [0, 1, 1, 3]


def sparse_mm_case(cols: tuple[int, ...], n: int = 6) -> ReproCase:
    rows = tuple(range(len(cols)))
    indices = TensorSpec((2, len(cols)), dtype="int64", values=Literal(rows + cols))
    values = TensorSpec((len(cols),), values=Literal(tuple(1.0 for _ in cols)))
    adj = TensorSpec((n, n), layout="sparse_coo", parts=(indices, values), coalesced=False)
    return ReproCase("torch.sparse.mm", (adj, TensorSpec((n, 3))))


def test_emitted_sparse_repro_builds_the_layout_and_fails_on_cpu(tmp_path: Path) -> None:
    code = emit(sparse_mm_case((1, 9, 2))).code
    assert "torch.sparse_coo_tensor(" in code and "check_invariants=False" in code
    assert "[[0, 1, 2], [1, 9, 2]]" in code  # the recorded index values
    script = tmp_path / "repro.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "index out of column bound" in done.stderr


def column_out_of_bounds(case: ReproCase) -> bool:
    """The CPU check of sparse.mm, in pure Python: some stored column id >= the size."""
    adj = case.args[0]
    if not isinstance(adj, TensorSpec) or not adj.is_sparse:
        return False  # a dense stand-in would never fail this way
    indices = adj.part("indices")
    if not isinstance(indices.values, Literal) or adj.shape[1] != case.args[1].shape[0]:
        return False
    count = indices.shape[1]
    return any(c >= adj.shape[1] for c in indices.values.values[count:])


def test_passes_cut_entries_to_the_offender_and_never_densify() -> None:
    case = sparse_mm_case((1, 4, 9, 2, 0, 3))
    shrinker = Shrinker(case, column_out_of_bounds, passes=PASSES, max_checks=400)
    best = shrinker.run()
    adj = best.args[0]
    assert isinstance(adj, TensorSpec) and adj.layout == "sparse_coo"
    assert coordinates(shrinker, adj) == [(0, 9)]  # one entry: its row zeroed, the bad id kept
    assert adj.shape == (1, 1) and best.args[1].shape[0] == 1
    assert isinstance(adj.part("values").values, Generated)


def test_csr_entries_are_cut_with_rebuilt_row_pointers() -> None:
    crow = TensorSpec((4,), dtype="int64", values=Literal((0, 1, 1, 3)))
    col = TensorSpec((3,), dtype="int64", values=Literal((2, 9, 0)))
    values = TensorSpec((3,), values=Literal((1.0, 2.0, 3.0)))
    adj = TensorSpec((3, 4), layout="sparse_csr", parts=(crow, col, values))
    case = ReproCase("torch.sparse.mm", (adj, TensorSpec((4, 2))))

    def bad_col(candidate: ReproCase) -> bool:
        spec = candidate.args[0]
        cols = spec.part("col_indices").values.values
        return spec.is_sparse and any(c >= spec.shape[1] for c in cols)

    shrinker = Shrinker(case, bad_col, passes=[cut_sparse_to_offender])
    best = shrinker.run().args[0]
    assert best.part("col_indices").values == Literal((9,))
    assert best.part("crow_indices").values == Literal((0, 1, 1, 1))  # moved to row 0
    assert coordinates(shrinker, best) == [(0, 9)]


# --- a tensor too large to store --------------------------------------------------------------


HUGE = 2**31 + 5  # past int32 offsets: the Triton overflow case needs 2.4e9 elements


def test_a_tensor_too_large_to_store_is_a_spec_with_generated_values() -> None:
    big = torch.empty(HUGE, dtype=torch.int8, device="meta")  # no memory behind it
    store = TensorStore()
    spec = arg_from_json(
        hold_call((big,), {}, "aten::add", store, everything=True).to_json()["args"][0]
    )
    assert HUGE > MAX_CAPTURED_ELEMENTS and store.tensors == {}
    assert isinstance(spec, TensorSpec) and isinstance(spec.values, Generated)
    assert (
        'torch.zeros(2147483653, dtype=torch.int8, device="meta")'
        in emit(ReproCase("torch.neg", (spec,))).code
    )


def test_the_shrinker_stops_at_the_size_that_still_fails() -> None:
    case = ReproCase("torch.neg", (TensorSpec((HUGE,), dtype="int8", values=Generated("zeros")),))
    threshold = 2**31 + 1  # fails only when a flat int32 offset wraps

    def overflows(candidate: ReproCase) -> bool:
        return candidate.args[0].numel >= threshold

    shrinker = Shrinker(case, overflows, passes=PASSES)
    best = shrinker.run()
    assert best.args[0].shape == (threshold,) and best.args[0].values == Generated("zeros")
    assert shrinker.checks < 40  # find_integer: logarithmic, no value is ever materialized
    assert shrink_dimensions.__name__ in shrinker.stats


# --- end to end on CPU ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sparse_shrink(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    root = tmp_path_factory.mktemp("sparse")
    code = main(["record", "--json", "--quiet", "--root", str(root / "rec"),
                 str(SCRIPTS / "sparse_ids.py")])  # fmt: skip
    assert code == 0
    run = RunDir.latest(root / "rec")
    failure = json.loads(run.failure_path.read_text())
    out = root / "out"
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "shrink", str(run.path), "--out", str(out), "--json",
         "--max-time", "120"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return failure, json.loads(done.stdout), out / "repro.py"


def test_sparse_fault_is_recorded_with_its_layout_and_the_bad_id(sparse_shrink) -> None:
    failure, _, _ = sparse_shrink
    assert failure["op"] == "aten::_sparse_addmm" and failure["public_call"] == "torch.sparse.mm"
    (adj,) = [t for t in failure["tensors"] if t["spec"].get("layout") == "sparse_coo"]
    assert any("column index max 47 ≥ size 40" in fact for fact in adj["facts"])


def test_sparse_repro_keeps_the_layout_and_fails_the_same_way_in_a_plain_run(sparse_shrink):
    failure, result, repro = sparse_shrink
    assert result["status"] == "verified" and result["statements"] <= 6
    code = repro.read_text()
    assert "torch.sparse_coo_tensor(" in code and "47" in code
    assert "torch.randn(40, 40)" not in code
    done = subprocess.run([sys.executable, repro.name], cwd=repro.parent, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    seen = signature_from_stderr(done.stderr)
    assert seen is not None and seen.kind == failure["signature"]["kind"]
