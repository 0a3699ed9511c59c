"""Capturing a call: layouts read and values copied before the op runs, JSON built later."""

from __future__ import annotations

import torch

from reprocut.model.tensors import spec_of
from reprocut.record.inside.capture import TensorStore, capture_call, hold_call


def test_held_call_gives_the_json_of_specs_read_at_capture_time():
    store = TensorStore()
    weight = torch.randn(6, 3)
    indices = torch.arange(12).reshape(3, 4).t()[1:]  # a strided, offset view
    held = hold_call((weight, [indices, 2]), {"dim": 0}, "aten::x", store, names=("a", "b"))
    indices.resize_(0)  # whatever happens later, the held layout is the one before the op
    weight_json, listed = held.to_json()["args"]
    assert weight_json == {
        "tensor": {
            "shape": [6, 3],
            "stride": None,
            "storage_offset": 0,
            "dtype": "float32",
            "device": "cpu",
            "requires_grad": False,
            "values": {"generated": "randn", "low": 0, "high": 1},
        }
    }
    view = listed["list"][0]["tensor"]
    assert (view["shape"], view["stride"], view["storage_offset"]) == ([3, 3], [1, 4], 1)
    expected = torch.tensor([[1, 5, 9], [2, 6, 10], [3, 7, 11]])
    assert torch.equal(store.tensors[view["values"]["captured"]], expected)
    assert listed["list"][1] == 2
    assert held.to_json()["kwargs"] == [["dim", 0]]
    assert held.to_json()["names"] == ["a", "b"]
    assert list(held.captured_keys()) == [view["values"]["captured"]]


def test_capture_call_matches_spec_of():
    store = TensorStore()
    tensor = torch.zeros(4, 5)[:, 1:]
    call = capture_call((tensor,), {}, "aten::x", store)
    spec = spec_of(tensor)
    json_spec = call["args"][0]["tensor"]
    assert (tuple(json_spec["shape"]), tuple(json_spec["stride"])) == (spec.shape, spec.stride)
    assert "names" not in call
