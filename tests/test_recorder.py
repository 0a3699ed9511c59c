"""The recorder in-process: steps, phases, module paths, the trace, culprits on CPU."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from reprocut.record.inside.recorder import Recorder, RecorderConfig


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(ids)).mean(1)


def read_trace(run_dir):
    return [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()]


def train(model, optimizer, ids, steps):
    for _ in range(steps):
        loss = model(ids).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_steps_are_optimizer_steps_and_repeats_are_back_references(tmp_path):
    model = Encoder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 10, (2, 5))
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        train(model, optimizer, ids, 3)
        assert recorder.state.step == 3
    steps = [r for r in read_trace(tmp_path) if r["type"] == "step"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert "ops" in steps[0]
    assert steps[2].get("same_as") == 1 or "ops" in steps[2]
    ops = steps[0]["ops"]
    phases = {phase for _, _, phase, _ in ops}
    assert {"forward", "backward", "optimizer"} <= phases
    embedding = next(op for op in ops if op[0] == "aten::embedding")
    assert embedding[1] == "model.embed"
    assert embedding[3][1] == [[2, 5], "int64", [5, 1], 0, "cpu"]


def test_culprit_on_cpu_has_op_module_source_and_inputs(tmp_path):
    model = Encoder()
    ids = torch.tensor([[1, 2, 10]])
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        with pytest.raises(IndexError):
            model(ids)
        culprit = recorder.state.culprit
    assert culprit is not None
    assert culprit.op == "aten::embedding"
    assert culprit.public_call == "torch.nn.functional.embedding"
    assert culprit.module == "model.embed"
    assert culprit.source is not None and culprit.source.function == "forward"
    assert culprit.synchronized
    index_key = culprit.call["args"][1]["tensor"]["values"]["captured"]
    assert recorder.store.tensors[index_key].tolist() == [[1, 2, 10]]


def test_composite_public_call_is_the_culprit_when_no_aten_op_raises(tmp_path):
    labels = torch.tensor([0, 4])
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        with pytest.raises(RuntimeError):
            F.one_hot(labels, num_classes=4)
        culprit = recorder.state.culprit
    assert culprit is not None and culprit.op is None
    assert culprit.public_call == "torch.nn.functional.one_hot"
    assert culprit.public["args"][0]["tensor"]["values"]["captured"]


def test_modes_are_removed_on_exit(tmp_path):
    from torch.overrides import _get_current_function_mode
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with Recorder(RecorderConfig(run_dir=tmp_path)):
        assert _get_current_dispatch_mode() is not None
    assert _get_current_dispatch_mode() is None
    assert _get_current_function_mode() is None


@torch.library.custom_op("reprocut_test::surfaces_late", mutates_args=())
def _surfaces_late(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be ...")


def test_a_cuda_error_surfacing_in_an_unsynchronized_op_is_not_its_own(tmp_path):
    """On the H200 the next batch's `.to("cuda")` (CPU arguments) raised an earlier embedding's
    assert and was blamed for it. An asynchronous CUDA error never names the op it surfaced in."""
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        with pytest.raises(RuntimeError, match="device-side assert"):
            torch.ops.reprocut_test.surfaces_late(torch.ones(2))
        assert recorder.state.culprit is None


def test_snapshots_with_evidence_are_replayed_first():
    from reprocut.localize.replay import rank_snapshots

    def snapshot(seq, key):
        spec = {"shape": [3], "dtype": "int64", "values": {"captured": key}}
        weight = {"shape": [5, 2], "values": {"generated": "randn", "low": 0, "high": 1}}
        return {
            "seq": seq,
            "op": "aten::embedding",
            "target": "torch.ops.aten.embedding.default",
            "call": {"args": [{"tensor": weight}, {"tensor": spec}], "kwargs": []},
            "public_call": None,
            "public": None,
        }

    inputs = {"ok": torch.tensor([0, 1, 2]), "bad": torch.tensor([0, 7, 2])}
    ranked = rank_snapshots([snapshot(1, "ok"), snapshot(2, "bad"), snapshot(3, "ok")], inputs)
    assert [s["seq"] for s in ranked] == [2, 1, 3]


def test_the_localize_window_opens_and_closes_at_step_boundaries(tmp_path):
    model = Encoder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 10, (2, 5))
    seen = []
    config = RecorderConfig(run_dir=tmp_path, localize_from=1, localize_to=2)
    with Recorder(config) as recorder:
        for _ in range(4):
            seen.append(recorder.state.localizing)
            train(model, optimizer, ids, 1)
    assert seen == [False, True, True, False]


class FakeEvent:
    """torch.cuda.Event on a CPU machine: completes when the test says so."""

    done = False

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return FakeEvent.done


def test_snapshots_live_until_their_step_completes_then_release_their_copies(tmp_path, monkeypatch):
    """The CUDA snapshot path, on CPU tensors: evidence is copied before each asserting op, the
    JSON is built only when asked, and a completed step's copies leave the store."""
    import reprocut.record.inside.ops as recorder_module

    monkeypatch.setattr(recorder_module, "_touches_cuda", lambda args, kwargs: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # events are kept per device
    monkeypatch.setattr(FakeEvent, "done", False)
    model = Encoder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 10, (2, 5))
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        train(model, optimizer, ids, 2)
        snapshots = recorder.state.all_snapshots()
        assert [(s.step, s.op) for s in snapshots] == [
            (0, "aten::embedding"),
            (0, "aten::embedding_dense_backward"),
            (1, "aten::embedding"),
            (1, "aten::embedding_dense_backward"),
        ]
        first = snapshots[0].to_json()
        weight, indices = first["call"]["args"]
        assert first["call"]["names"][:2] == ["weight", "indices"]
        assert weight["tensor"]["shape"] == [10, 4]
        assert "generated" in weight["tensor"]["values"]  # weights: the shape is enough
        key = indices["tensor"]["values"]["captured"]
        assert torch.equal(recorder.store.tensors[key], ids)
        assert first["module"] == "model.embed" and first["phase"] == "forward"
        assert set(recorder.store.tensors) == {k for s in snapshots for k in s.captured_keys()}

        FakeEvent.done = True
        train(model, optimizer, ids, 1)
        assert recorder.state.all_snapshots() == []
        assert recorder.state.healthy_through == 2
        assert recorder.store.tensors == {}


def test_custom_autograd_functions_still_work_after_the_recorder_leaves(tmp_path):
    """The recorder wraps `Function.apply`; putting back the bound method instead of the
    classmethod made every later Function call `Function.forward` (NotImplementedError),
    which broke a later checkpointed block in the same process (pytest, notebooks)."""

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    x = torch.ones(3, requires_grad=True)
    with Recorder(RecorderConfig(run_dir=tmp_path)):
        inside = Double.apply(x)
    after = Double.apply(x)
    assert torch.equal(inside, after) and "apply" in vars(torch.autograd.Function)
    after.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
