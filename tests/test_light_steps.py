"""The GPU's light-step path on CPU tensors: shared host copies, modules found on the stack.

On a GPU, steps after the first few see only the asserting ops (tripwire), with the function
mode off, and snapshot them. These tests force that path on CPU (light steps, `_touches_cuda`
true, public calls captured as for CUDA tensors) and check the evidence it leaves."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules import module as module_hooks

import reprocut.record.inside.ops as ops_module
import reprocut.record.inside.public as public_module
from reprocut.record.inside.capture import ASSERTING_OPS
from reprocut.record.inside.recorder import Recorder, RecorderConfig


@pytest.fixture
def gpu_like(monkeypatch):
    """Snapshots and public captures as on a GPU; the function modes off, as after step 0 (no
    public-call mode, and no raise watch: a GPU run's light steps have neither)."""
    monkeypatch.setattr(ops_module, "_touches_cuda", lambda args, kwargs: True)
    monkeypatch.setattr(public_module, "on_cpu", lambda args, kwargs: False)

    def start(run_dir, **config):
        recorder = Recorder(RecorderConfig(run_dir=run_dir, light_steps=True, **config))
        recorder.__enter__()
        recorder._function_mode.set(False)
        monkeypatch.setattr(recorder._function_mode, "set", lambda active: None)
        monkeypatch.setattr(recorder._raise_watch, "set", lambda active: None)
        return recorder

    return start


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids)).flatten(0, 1)


def train_step(model, optimizer, ids, labels):
    loss = F.cross_entropy(model(ids), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_a_light_step_copies_the_cross_entropy_target_once_for_its_three_uses(tmp_path, gpu_like):
    model = Tagger()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 10, (2, 5))
    labels = torch.randint(0, 3, (10,))
    recorder = gpu_like(tmp_path)
    try:
        for _ in range(3):  # steps 0-2 record every op; step 3 is light
            train_step(model, optimizer, ids, labels)
        assert recorder.light_step
        loss = F.cross_entropy(model(ids), labels)
        loss.backward()
        snapshots = {s.op: s for s in recorder.state.snapshots}
        forward = snapshots["aten::nll_loss_forward"].to_json()
        backward = snapshots["aten::nll_loss_backward"].to_json()
        public = forward["public"]
        assert forward["public_call"] == "torch.nn.functional.cross_entropy"

        def key(call, name):
            arg = call["args"][call["names"].index(name)]
            return arg["tensor"]["values"]["captured"]

        target = key(forward["call"], "target")
        assert key(backward["call"], "target") == target == key(public, "target")
        assert torch.equal(recorder.store.tensors[target], labels)
        # the embedding's ids and its backward's indices: one copy as well
        embed = snapshots["aten::embedding"].to_json()
        embed_backward = snapshots["aten::embedding_dense_backward"].to_json()
        assert key(embed["call"], "indices") == key(embed_backward["call"], "indices")
        step_keys = {k for s in recorder.state.snapshots for k in s.captured_keys()}
        assert step_keys == {target, key(embed["call"], "indices")}
        optimizer.step()  # the step ends: the next one copies afresh
        loss = F.cross_entropy(model(ids), labels)
        loss.backward()
        next_keys = {k for s in recorder.state.snapshots for k in s.captured_keys()}
        assert len(next_keys) == 2 and not next_keys & step_keys
    finally:
        recorder.close()


def test_a_tensor_changed_in_place_between_two_ops_gets_a_copy_of_each_version(tmp_path, gpu_like):
    weight = torch.randn(10, 4)
    ids = torch.tensor([[1, 2, 3]])
    recorder = gpu_like(tmp_path)
    try:
        F.embedding(ids, weight)
        ids.add_(5)  # in place: a new version of the same tensor object
        F.embedding(ids, weight)
        ids.data[0, 0] = 0  # through .data: the version the copy was taken at stays
        F.embedding(ids.clone(), weight)  # another object with the same values
        first, second, third = (
            s.to_json() for s in recorder.state.snapshots if s.op == "aten::embedding"
        )
        keys = [
            s["call"]["args"][1]["tensor"]["values"]["captured"] for s in (first, second, third)
        ]
        assert len(set(keys)) == 3
        assert recorder.store.tensors[keys[0]].tolist() == [[1, 2, 3]]
        assert recorder.store.tensors[keys[1]].tolist() == [[6, 7, 8]]
        assert recorder.store.tensors[keys[2]].tolist() == [[0, 7, 8]]
    finally:
        recorder.close()


def test_an_inference_tensor_has_no_version_and_is_copied_each_time(tmp_path, gpu_like):
    weight = torch.randn(10, 4)
    with torch.inference_mode():
        ids = torch.tensor([[4, 5]])
    recorder = gpu_like(tmp_path)
    try:
        F.embedding(ids, weight)
        F.embedding(ids, weight)
        keys = {k for s in recorder.state.snapshots for k in s.captured_keys()}
        assert len(keys) == 4  # the op's ids and the public call's, at each of the two calls
        assert all(recorder.store.tensors[k].tolist() == [[4, 5]] for k in keys)
    finally:
        recorder.close()


def test_light_steps_drop_the_module_hooks_and_name_modules_from_the_stack(tmp_path, gpu_like):
    model = Tagger()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 10, (2, 5))
    labels = torch.randint(0, 3, (10,))
    hooks_before = len(module_hooks._global_forward_hooks)
    recorder = gpu_like(tmp_path)
    try:
        for step in range(5):
            light = recorder.light_step
            has_hooks = bool(recorder._module_hooks)
            assert has_hooks != light, f"step {step}: hooks only where every op is seen"
            if step == 3:
                loss = F.cross_entropy(model(ids), labels)
                loss.backward()
                embed, *_, embed_backward = recorder.state.snapshots
                assert (embed.op, embed.module) == ("aten::embedding", "model.embed")
                # the node learnt its forward line from the snapshot: backward's call site
                assert embed_backward.op == "aten::embedding_dense_backward"
                assert embed_backward.call_site == embed.call_site is not None
                optimizer.step()
            else:
                train_step(model, optimizer, ids, labels)
        assert recorder.state.step == 5
    finally:
        recorder.close()
    assert len(module_hooks._global_forward_hooks) == hooks_before
    steps = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert '"every_op": false' in steps[3] and '"every_op": false' not in steps[4]


def test_without_an_optimizer_the_hooks_stay_they_mark_the_steps(tmp_path, gpu_like):
    model = Tagger()
    ids = torch.randint(0, 10, (2, 5))
    recorder = gpu_like(tmp_path)
    try:
        with torch.no_grad():
            for _ in range(6):
                model(ids)
        assert recorder.state.step == 5  # each top-level forward after the first ends a step
        assert recorder.light_step and recorder._module_hooks
    finally:
        recorder.close()


def test_a_light_step_records_its_asserting_ops_layouts_as_a_full_step_does(tmp_path, gpu_like):
    """Light steps take the specs from the snapshot's held layouts (no second read): the same
    tuples, so unchanged layouts keep the next steps light."""
    model = Tagger()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 10, (2, 5))
    labels = torch.randint(0, 3, (10,))
    recorder = gpu_like(tmp_path)
    try:
        for _ in range(6):  # 0-2 and 4 record every op, 3 and 5 are light
            train_step(model, optimizer, ids, labels)
    finally:
        recorder.close()
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]

    def ops_of(step: int) -> list[list]:
        record = records[step]
        return records[record["same_as"]]["ops"] if "same_as" in record else record["ops"]

    full = [(op[0], op[3]) for op in ops_of(4) if op[0] in ASSERTING_OPS]
    light = [(op[0], op[3]) for op in ops_of(5)]
    assert light == full and len(full) >= 4  # embedding, nll_loss and their backward ops
    assert records[5].get("every_op") is False
