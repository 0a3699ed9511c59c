"""The facts that explain a failure, computed from real tensors."""

from __future__ import annotations

import torch

from reprocut.localize.explain import explain_inputs
from reprocut.model.case import Generated, TensorSpec, arg_to_json
from reprocut.report.diagnosis import explain, layout_facts, range_facts


def test_embedding_names_the_offending_id_and_its_position():
    weight = torch.zeros(1000, 4)
    ids = torch.randint(0, 1000, (8, 32))
    ids[2, 3] = 1000
    facts = explain("aten::embedding", None, [weight, ids], {}).facts[1]
    assert "index max 1000 ≥ 1000 rows at [2, 3]" in facts


def test_targets_skip_ignore_index():
    logits = torch.zeros(6, 10)
    target = torch.tensor([0, 1, -100, 10, 2, 3])
    facts = explain("aten::nll_loss_forward", None, [logits, target, None, 1, -100], {}).facts[1]
    assert facts[0] == "target max 10 ≥ 10 classes at [3]"
    assert facts[-1] == "1 of 6 target values outside [0, 10)"


def test_probability_facts_count_nan_and_dtype():
    probs = torch.softmax(torch.randn(2, 5), -1).half()
    probs[1, 3] = float("nan")
    facts = explain("aten::multinomial", None, [probs, 1], {}).facts[0]
    assert facts[0] == "1 NaN (first at [1, 3])"
    assert "dtype float16" in facts


def test_bce_input_above_one():
    p = torch.full((4,), 0.5)
    p[2] = 1.7
    facts = explain("aten::binary_cross_entropy", None, [p, torch.ones(4)], {}).facts[0]
    assert any("input 1.7 outside [0, 1] at [2]" in f for f in facts)


def test_one_hot_public_call():
    facts = explain(
        None, "torch.nn.functional.one_hot", [torch.tensor([0, 3, 1])], {"num_classes": 3}
    )
    assert facts.facts[0][0] == "class value max 3 ≥ 3 classes at [1]"
    assert facts.family == "one_hot"


def test_negative_and_large_values_both_reported():
    facts = range_facts(torch.tensor([5, -1, 2, 9]), 0, 6, what="index", unit="rows")
    assert facts == (
        "index max 9 ≥ 6 rows at [3]",
        "index -1 < 0 at [1]",
        "2 of 4 index values outside [0, 6)",
    )


def test_gather_index_against_the_gathered_dim():
    scores = torch.zeros(4, 5)
    index = torch.tensor([[0], [5], [1], [2]])
    facts = explain("aten::gather", None, [scores, 1, index], {}).facts[2]
    assert facts[0] == "index max 5 ≥ 5 (size of dim 1) at [1, 0]"


def test_layout_facts_name_what_a_flat_buffer_kernel_gets_wrong():
    expanded = TensorSpec((256, 256, 4096), (4096, 0, 1), 0, "float32", "cuda")
    assert layout_facts(expanded) == (
        "stride 0 in dim 1 (an expand()ed view): 268435456 elements over 1048576 of storage",
    )
    offset = TensorSpec((572,), None, 1170, "float32", "cuda")
    assert layout_facts(offset) == ("storage offset 1170 (4680 bytes: not 16-byte aligned)",)
    assert layout_facts(TensorSpec((8,), None, 4, "float32")) == (
        "storage offset 4 (16 bytes: 16-byte aligned)",
    )
    transposed = TensorSpec((4, 8), (1, 4), 0, "float32")
    assert layout_facts(transposed) == ("not contiguous: stride (1, 4) for shape (4, 8)",)
    assert layout_facts(TensorSpec((4, 8))) == ()


def test_a_custom_op_argument_gets_the_layout_a_flat_buffer_kernel_misreads():
    """fused::gated (cuda_triton_op_compiled) gets a gate expand()ed over batch and tokens."""
    gate = torch.zeros(64).expand(2, 8, 64)
    facts = explain("fused::gated", None, [torch.ones(2, 8, 64), gate], {}).facts
    assert facts[1] == (
        "stride 0 in dims 0, 1 (an expand()ed view): 1024 elements over 64 of storage",
    )


def test_a_call_too_big_to_make_still_says_how_its_inputs_are_laid_out() -> None:
    """A custom op's inputs recorded without values, too big to generate just to look at, keep
    the facts their specs say alone: the gate `expand()`ed over the input (stride 0)."""
    x = TensorSpec((128, 256, 4096), device="cuda", values=Generated("randn"))
    gate = TensorSpec((128, 256, 4096), stride=(0, 0, 1), device="cuda", values=Generated("randn"))
    culprit = {
        "op": "fused::gated",
        "call": {"args": [arg_to_json(x), arg_to_json(gate)], "kwargs": [], "names": ["x", "gate"]},
    }
    illegal = "CUDA error: an illegal memory access was encountered"
    rows, _ = explain_inputs(culprit, {}, illegal)
    facts = {row.name: row.facts for row in rows}
    assert facts["x"] == ()
    assert facts["gate"] == (
        "stride 0 in dims 0, 1 (an expand()ed view): 134217728 elements over 4096 of storage",
    )
    rows, _ = explain_inputs(culprit, {}, "Expected size 3 but got size 4")  # not about layout
    assert all(row.facts == () for row in rows)
