"""ReproCase -> JSON -> ReproCase round trips, for every kind of argument."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from reprocut.model.case import (
    ArgList,
    Captured,
    Generated,
    Literal,
    ReproCase,
    Signature,
    Symbol,
    TensorSpec,
    contiguous_stride,
)

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)
values = st.one_of(
    st.builds(Captured, st.text("abc0123", min_size=1, max_size=4)),
    st.builds(
        Literal,
        st.lists(st.one_of(st.integers(-5, 5), st.floats(allow_nan=False)), max_size=4).map(tuple),
    ),
    st.builds(
        Generated,
        st.sampled_from(["randn", "zeros", "randint"]),
        st.integers(0, 3),
        st.integers(4, 9),
    ),
)
specs = st.builds(
    TensorSpec,
    shape=shapes,
    stride=st.none(),
    storage_offset=st.integers(0, 3),
    dtype=st.sampled_from(["float32", "int64", "bfloat16"]),
    device=st.sampled_from(["cpu", "cuda:0"]),
    requires_grad=st.booleans(),
    values=values,
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-9, 9), st.floats(allow_nan=False), st.text(max_size=3)
)
args = st.recursive(
    st.one_of(
        specs, scalars, st.builds(Symbol, st.sampled_from(["torch.float16", "torch.channels_last"]))
    ),
    lambda inner: st.builds(ArgList, st.lists(inner, max_size=3).map(tuple)),
    max_leaves=6,
)
signatures = st.builds(
    Signature,
    st.sampled_from(["IndexError", "AcceleratorError"]),
    st.one_of(st.none(), st.just(710)),
    st.one_of(st.none(), st.just("aten::embedding")),
    st.text(max_size=10),
)


@given(
    st.builds(
        ReproCase,
        target=st.sampled_from(["torch.gather", "torch.Tensor.scatter_add_"]),
        args=st.lists(args, max_size=4).map(tuple),
        kwargs=st.lists(st.tuples(st.sampled_from(["dim", "out"]), args), max_size=2).map(tuple),
        expected=st.one_of(st.none(), signatures),
    )
)
def test_round_trip(case):
    assert ReproCase.loads(case.dumps()) == case


def test_nan_and_infinity_survive_json():
    spec = TensorSpec((3,), values=Literal((math.nan, math.inf, -1.0)))
    back = ReproCase.loads(ReproCase("torch.multinomial", (spec, 1)).dumps())
    restored = back.args[0].values.values
    assert math.isnan(restored[0]) and restored[1] == math.inf and restored[2] == -1.0


def test_strides_and_storage_extent():
    assert contiguous_stride((2, 3, 4)) == (12, 4, 1)
    view = TensorSpec((3, 5), stride=(0, 1), storage_offset=2)
    assert not view.is_contiguous
    assert view.storage_numel == 7
    assert TensorSpec((2, 3)).storage_numel == 6
