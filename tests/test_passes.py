"""Each pass alone against a pure-Python predicate (no torch run, no subprocess): exact results."""

from __future__ import annotations

import math

import torch

from reprocut.model.case import Captured, Generated, Literal, ReproCase, TensorSpec
from reprocut.shrink.case_edits import slice_values
from reprocut.shrink.passes import (
    cut_index_to_offender,
    drop_optional_kwargs,
    drop_requires_grad,
    make_contiguous,
    move_to_cpu,
    offenders,
    replace_values_with_generator,
    shrink_dimensions,
    simplify_dtype,
    zero_storage_offset,
)
from reprocut.shrink.shrinker import Shrinker, find_integer, shrink


def embedding_case(ids: tuple[int, ...], rows: int = 10, cols: int = 3) -> ReproCase:
    return ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((len(ids),), dtype="int64", values=Literal(ids)),
            TensorSpec((rows, cols), values=Generated("randn")),
        ),
    )


def ids_of(case: ReproCase) -> tuple[int, ...]:
    values = case.args[0].values
    assert isinstance(values, Literal)
    return values.values


def embedding_fails(case: ReproCase) -> bool:
    ids, weight = case.args[0], case.args[1]
    return isinstance(ids.values, Literal) and any(
        v >= weight.shape[0] or v < 0 for v in ids.values.values
    )


def test_cut_index_to_offender_keeps_only_the_bad_index() -> None:
    shrunk = shrink(embedding_case((0, 3, 99, 1)), embedding_fails, [cut_index_to_offender])
    assert ids_of(shrunk) == (99,)
    assert shrunk.args[0].shape == (1,)


def test_cut_index_to_offender_reads_captured_values() -> None:
    case = ReproCase(
        "torch.nn.functional.embedding",
        (TensorSpec((2, 3), dtype="int64", values=Captured("ids")), TensorSpec((10, 3))),
    )
    inputs = {"ids": torch.tensor([[1, 2, 3], [4, 12, 5]])}
    shrunk = Shrinker(case, embedding_fails, passes=[cut_index_to_offender], inputs=inputs).run()
    assert shrunk.args[0].shape == (1, 1)
    assert ids_of(shrunk) == (12,)


def test_cut_index_to_offender_bisects_when_no_rule_knows_the_range() -> None:
    case = ReproCase(
        "torch.some_op", (TensorSpec((6,), dtype="int64", values=Literal((1, 2, 5, 3, 4, 6))),)
    )

    def has_five(c: ReproCase) -> bool:
        values = c.args[0].values
        return isinstance(values, Literal) and 5 in values.values

    shrunk = shrink(case, has_five, [cut_index_to_offender])
    assert shrunk.args[0].values == Literal((5,))


def test_cut_index_to_offender_leaves_float_data_without_bad_values_alone() -> None:
    case = ReproCase("torch.some_op", (TensorSpec((4,), values=Literal((1.0, 2.0, 3.0, 4.0))),))
    shrinker = Shrinker(case, lambda c: True, passes=[cut_index_to_offender])
    assert shrinker.run() == case
    assert shrinker.checks == 0


def test_cut_target_also_cuts_the_batch_of_the_input() -> None:
    case = ReproCase(
        "torch.nn.functional.cross_entropy",
        (TensorSpec((4, 5)), TensorSpec((4,), dtype="int64", values=Literal((0, 1, 9, 2)))),
    )

    def ce_fails(c: ReproCase) -> bool:
        x, t = c.args
        return x.shape[0] == t.shape[0] and any(v >= x.shape[1] for v in t.values.values)

    shrunk = shrink(case, ce_fails, [cut_index_to_offender])
    assert shrunk.args[0].shape == (1, 5)
    assert shrunk.args[1].values == Literal((9,))


def test_offenders_know_the_ranges_of_the_assert_ops() -> None:
    gather = ReproCase("torch.gather", (TensorSpec((4, 3)), 1, TensorSpec((2,), dtype="int64")))
    assert offenders(gather, ("args", 2), [2, 3, -4, -3]) == [1, 2]
    one_hot = ReproCase("torch.nn.functional.one_hot", (TensorSpec((3,), dtype="int64"), 3))
    assert offenders(one_hot, ("args", 0), [0, 3, 2]) == [1]
    multinomial = ReproCase("torch.multinomial", (TensorSpec((3,)), 1))
    assert offenders(multinomial, ("args", 0), [0.5, math.nan, -1.0]) == [1, 2]
    ce = ReproCase(
        "torch.nn.functional.cross_entropy", (TensorSpec((2, 3)), TensorSpec((3,), dtype="int64"))
    )
    assert offenders(ce, ("args", 1), [-100, 3, 1]) == [1]


def test_shrink_dimensions_goes_to_the_smallest_size_that_still_fails() -> None:
    case = ReproCase("torch.op", (TensorSpec((100, 7)),))

    def needs_37_rows(c: ReproCase) -> bool:
        return c.args[0].shape[0] >= 37

    shrunk = shrink(case, needs_37_rows, [shrink_dimensions])
    assert shrunk.args[0].shape == (37, 1)


def test_shrink_dimensions_cuts_shared_dimensions_together() -> None:
    case = ReproCase(
        "torch.op", (TensorSpec((8, 5)), TensorSpec((8,), dtype="int64", values=Generated("zeros")))
    )

    def batches_agree(c: ReproCase) -> bool:
        return c.args[0].shape[0] == c.args[1].shape[0]

    shrunk = shrink(case, batches_agree, [shrink_dimensions])
    assert shrunk.args[0].shape == (1, 1)
    assert shrunk.args[1].shape == (1,)


def test_shrink_dimensions_slices_literal_values_row_major() -> None:
    assert slice_values([1, 2, 3, 4, 5, 6], (2, 3), 1, 2) == [1, 2, 4, 5]
    assert slice_values([1, 2, 3, 4, 5, 6], (2, 3), 0, 1) == [1, 2, 3]


def test_find_integer_finds_the_largest_success() -> None:
    calls: list[int] = []

    def below_1000(k: int) -> bool:
        calls.append(k)
        return k < 1000

    assert find_integer(below_1000) == 999
    assert len(calls) < 40


def test_drop_optional_kwargs_drops_what_is_not_needed() -> None:
    case = embedding_case((99,))
    case = ReproCase(case.target, (*case.args, 0), kwargs=(("max_norm", 1.0), ("sparse", False)))

    def needs_max_norm(c: ReproCase) -> bool:
        return "max_norm" in dict(c.kwargs)

    shrunk = shrink(case, needs_max_norm, [drop_optional_kwargs])
    assert shrunk.kwargs == (("max_norm", 1.0),)
    assert len(shrunk.args) == 2


def test_replace_values_with_generator_keeps_offending_values() -> None:
    case = ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((1,), dtype="int64", values=Literal((99,))),
            TensorSpec((2, 2), values=Literal((1.0, 2.0, 3.0, 4.0))),
        ),
    )
    shrunk = shrink(case, embedding_fails, [replace_values_with_generator])
    assert shrunk.args[0].values == Literal((99,))
    assert shrunk.args[1].values == Generated("zeros")


def test_layout_dtype_device_and_grad_passes() -> None:
    spec = TensorSpec(
        (2, 2), stride=(1, 2), storage_offset=3, dtype="float16", device="cuda", requires_grad=True
    )
    case = ReproCase("torch.op", (spec,))
    everything = [simplify_dtype, make_contiguous, zero_storage_offset, drop_requires_grad]
    shrunk = shrink(case, lambda c: True, everything)
    assert shrunk.args[0] == TensorSpec((2, 2), dtype="float32", device="cuda")
    # move_to_cpu only runs when the bug is CPU-visible
    assert shrink(case, lambda c: True, [move_to_cpu]).args[0].device == "cuda"
    moved = Shrinker(case, lambda c: True, passes=[move_to_cpu], cpu_visible=True).run()
    assert moved.args[0].device == "cpu"


def test_passes_that_must_keep_a_property_leave_it_alone() -> None:
    spec = TensorSpec((2, 2), stride=(1, 2), storage_offset=3, dtype="float16")
    case = ReproCase("torch.op", (spec,))

    def needs_layout(c: ReproCase) -> bool:
        s = c.args[0]
        return s.dtype == "float16" and not s.is_contiguous and s.storage_offset == 3

    assert (
        shrink(case, needs_layout, [simplify_dtype, make_contiguous, zero_storage_offset]) == case
    )


def test_offenders_of_index_lists_use_the_indexed_dimension() -> None:
    from reprocut.model.case import ArgList

    index_put = ReproCase(
        "torch.Tensor.index_put_",
        (
            TensorSpec((4, 3)),
            ArgList((TensorSpec((2,), dtype="int64"), TensorSpec((2,), dtype="int64"))),
            TensorSpec((2,)),
        ),
    )
    assert offenders(index_put, ("args", 1, 0), [3, 4]) == [1]
    assert offenders(index_put, ("args", 1, 1), [3, 2]) == [0]


def test_aten_targets_use_the_schema_argument_order() -> None:
    aten = ReproCase(
        "torch.ops.aten.embedding.default",
        (TensorSpec((10, 3)), TensorSpec((3,), dtype="int64")),
    )
    assert offenders(aten, ("args", 1), [1, 10, 2]) == [1]
    index_add = ReproCase(
        "torch.ops.aten.index_add_.default",
        (TensorSpec((4, 2)), 0, TensorSpec((2,), dtype="int64"), TensorSpec((2, 2))),
    )
    assert offenders(index_add, ("args", 2), [3, 4]) == [1]
