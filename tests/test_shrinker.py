"""Properties of the shrink loop on generated cases: it never accepts a non-matching candidate,
never grows, and stops at a fixed point."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reprocut.model.case import Generated, Literal, ReproCase, TensorSpec
from reprocut.shrink.layout_passes import merge_dimensions, merge_dimensions_ahead
from reprocut.shrink.passes import PASSES, shrink_dimensions
from reprocut.shrink.shrinker import Shrinker, ShrinkEvent, sort_key
from reprocut.source.integer_search import is_round

DTYPES = st.sampled_from(["float32", "float16", "float64", "int64", "int32"])


@st.composite
def tensor_specs(draw: st.DrawFn) -> TensorSpec:
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    dtype = draw(DTYPES)
    numel = 1
    for size in shape:
        numel *= size
    if dtype.startswith("int"):
        values = draw(
            st.one_of(
                st.just(Generated("zeros")),
                st.lists(st.integers(-20, 20), min_size=numel, max_size=numel).map(
                    lambda v: Literal(tuple(v))
                ),
            )
        )
    else:
        values = draw(st.sampled_from([Generated("randn"), Generated("ones"), Generated("zeros")]))
    offset = draw(st.integers(0, 2))
    return TensorSpec(
        shape,
        storage_offset=offset,
        dtype=dtype,
        device=draw(st.sampled_from(["cpu", "cuda"])),
        values=values,
    )


@st.composite
def cases(draw: st.DrawFn) -> ReproCase:
    target = draw(st.sampled_from(["torch.nn.functional.embedding", "torch.gather", "torch.op"]))
    args = tuple(draw(st.lists(tensor_specs(), min_size=1, max_size=3)))
    kwargs = tuple((f"k{i}", i) for i in range(draw(st.integers(0, 2))))
    return ReproCase(target, args, kwargs)


def predicate_from(seed: int):
    """A deterministic property of a case (some hold for small cases, some for large)."""

    def holds(case: ReproCase) -> bool:
        return (
            hash((seed, case.total_numel() % 3, case.num_args(), len(case.kwargs))) % 4
        ) != 0 or case.total_numel() > 40

    return holds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 1000))
@example(  # ids (3, 1) cut to (1, 2) once lengthened a size-1 weight to (2,), its one value kept
    ReproCase("torch.nn.functional.embedding", (
        TensorSpec((3, 1), dtype="int64", values=Literal((0, 0, 0))),
        TensorSpec((1,), dtype="int64", values=Literal((0,))),
    )),
    0,
)  # fmt: skip
def test_never_accepts_a_failing_candidate_and_never_grows(case: ReproCase, seed: int) -> None:
    holds = predicate_from(seed)
    accepted: list[ReproCase] = []
    checked: list[tuple[ReproCase, bool]] = []

    def recording(candidate: ReproCase) -> bool:
        result = holds(candidate)
        checked.append((candidate, result))
        return result

    shrinker = Shrinker(
        case,
        recording,
        passes=PASSES,
        on_accept=accepted.append,
        max_checks=300,
        cpu_visible=True,
    )
    best = shrinker.run()
    # every accepted candidate satisfied the predicate, and each was strictly smaller than the last
    previous = case
    for candidate in accepted:
        assert holds(candidate)
        assert sort_key(candidate) < sort_key(previous)
        previous = candidate
    assert best == (accepted[-1] if accepted else case)
    assert sort_key(best) <= sort_key(case)
    # candidates the predicate rejected never became best
    rejected = {c for c, ok in checked if not ok}
    assert best not in rejected or best == case
    # no check was paid for a candidate that was not strictly smaller than the best at the time
    assert shrinker.checks == len(checked)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_reaches_a_fixed_point(case: ReproCase) -> None:
    def always(candidate: ReproCase) -> bool:
        return True

    best = Shrinker(
        case, always, passes=PASSES, max_checks=10_000, max_time=60, cpu_visible=True
    ).run()
    again = Shrinker(best, always, passes=PASSES, max_checks=10_000, max_time=60, cpu_visible=True)
    assert again.run() == best
    assert again.checks == 0  # any strictly smaller candidate would have been accepted
    assert again.stopped == "fixed point"
    # with an always-true predicate every tensor ends at one element
    assert all(spec.numel == 1 for _, spec in best.tensors())


@settings(max_examples=30, deadline=None)
@given(cases(), st.integers(1, 20))
def test_budget_bounds_the_number_of_checks(case: ReproCase, budget: int) -> None:
    shrinker = Shrinker(case, lambda c: True, max_checks=budget, passes=PASSES)
    shrinker.run()
    assert shrinker.checks <= budget


def test_with_no_limit_given_a_round_that_removes_nothing_ends_it(monkeypatch) -> None:
    """The default (no max_time): the loop ends at its fixed point, the safety cap unreached;
    the cap and a user's limit each name themselves when they stop it."""
    from reprocut.model import limits

    case = ReproCase("torch.gather", (TensorSpec((6, 4), values=Generated("randn")),))
    bounded = Shrinker(case, lambda c: c.total_numel() >= 3, passes=PASSES, cpu_visible=True)
    best = bounded.run()
    assert bounded.stopped == "fixed point" and best.total_numel() == 3

    def slow(candidate: ReproCase) -> bool:
        time.sleep(0.02)
        return True

    assert _stopped(Shrinker(case, slow, passes=PASSES, max_time=0.01)) == "max time"
    monkeypatch.setattr(limits, "SAFETY_CAP", 0.01)
    assert _stopped(Shrinker(case, slow, passes=PASSES)) == "safety cap"


def _stopped(shrinker: Shrinker) -> str:
    shrinker.run()
    return shrinker.stopped


class ThreadedChecks:
    """A runner checking candidates on worker threads, the slower ones later (their verdicts
    come back out of order): CaseChecks with the predicate as its check."""

    def __init__(self, predicate, slots: int) -> None:
        self.predicate, self.slots = predicate, slots

    def run(self, case: ReproCase, slot: int, ticket: object) -> bool:
        time.sleep(0.001 * (hash(case) % 3))
        return self.predicate(case)

    def settle(self, case: ReproCase, slot: int, verdict: bool) -> bool:
        return verdict

    def accepts(self, verdict: bool) -> bool:
        return verdict


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 1000))
def test_checking_alternatives_side_by_side_gives_the_one_at_a_time_result(case, seed) -> None:
    holds = predicate_from(seed)
    trails: list[list[tuple[str, int, int]]] = []
    results = []
    for runner in (None, ThreadedChecks(holds, 3)):
        trail: list[tuple[str, int, int]] = []
        shrinker = Shrinker(case, holds, passes=PASSES, runner=runner, cpu_visible=True,
                            on_event=lambda e, t=trail: t.append((e.kind, e.checks, e.size)))  # fmt: skip
        results.append((shrinker.run(), shrinker.checks, shrinker.stopped))
        trails.append(trail)
    assert results[0] == results[1]
    assert trails[0] == trails[1]  # the same checks, accepted in the same order


@pytest.mark.parametrize("threshold", [1, 3, 1000, 3000, 4095])
def test_a_dimension_searched_four_ways_a_round_reaches_the_same_smallest_size(threshold) -> None:
    """A memory fault's captured call checks for seconds (on the H200 a triton_op's 129
    checks took 350 s): with four slots a dimension's span is cut a round at a time, the cuts
    checked side by side, and the search ends at the smallest round size that still fails
    (three significant binary digits: 1024 for 1000, reprocut.source.integer_search), in
    fewer rounds than halving and walking down by one, one check at a time, to the exact one."""
    case = ReproCase("torch.gather", (TensorSpec((4096,), values=Generated("randn")),))

    def holds(candidate: ReproCase) -> bool:
        return candidate.total_numel() >= threshold

    results = {}
    for ways, runner in ((1, None), (4, ThreadedChecks(holds, 4))):
        steps: list[ShrinkEvent] = []
        shrinker = Shrinker(case, holds, passes=[shrink_dimensions], runner=runner, ways=ways,
                            on_event=steps.append)  # fmt: skip
        best = shrinker.run()
        results[ways] = (best.total_numel(), sum(1 for e in steps if e.kind == "accepted"))
    assert results[1][0] == threshold
    smallest_round = min(v for v in range(threshold, 4097) if is_round(v))
    assert results[4][0] == smallest_round
    assert results[4][1] <= results[1][1]  # accepted steps, each a round: at most as many


def test_a_size_the_failure_needs_costs_three_checks_a_round_with_four_slots() -> None:
    """1, half and the round size below rejected: the dimension is left, where a round of
    four-way cuts asked six (on the H200 every round of passes asked them again for each
    such size)."""
    case = ReproCase("torch.gather", (TensorSpec((4096,), values=Generated("randn")),))
    seen: list[ReproCase] = []

    def holds(candidate: ReproCase) -> bool:
        seen.append(candidate)
        return candidate.total_numel() == 4096

    shrinker = Shrinker(case, holds, passes=[shrink_dimensions], ways=4)
    assert shrinker.run() == case
    assert [c.total_numel() for c in seen] == [1, 2048, 3584]


def test_a_tensor_that_fails_past_a_size_merges_its_dimensions_and_ends_at_that_size() -> None:
    """A kernel reading numel() elements fails past a size however the tensor is shaped: as one
    dimension the search ends at that size exactly; dimension by dimension it ends above it."""
    case = ReproCase("torch.ops.fused.gated", (TensorSpec((8, 16, 32), values=Generated("randn")),))

    def holds(candidate: ReproCase) -> bool:
        return candidate.total_numel() >= 1000

    merged = Shrinker(case, holds, passes=[merge_dimensions, shrink_dimensions]).run()
    assert [spec.shape for _, spec in merged.tensors()] == [(1000,)]
    apart = Shrinker(case, holds, passes=[shrink_dimensions]).run()
    assert apart.total_numel() > 1000  # (e.g. 2 x 16 x 32 -> ...) no exact product
    default = Shrinker(case, holds, passes=PASSES, cpu_visible=True).run()  # merged after a round
    assert [spec.shape for _, spec in default.tensors()] == [(1000,)]


def test_a_memory_faults_tensor_is_searched_as_one_dimension_first_for_fewer_checks() -> None:
    """cuda_triton_op_compiled's gated op as a CPU model: an input of 128 x 256 x 4096 beside
    an expanded gate, the kernel faulting from 20.97 M input elements on. Searched several ways
    at once (a memory fault's call), the input is merged before its dimensions are searched:
    the same end, for fewer checks; one search at a time keeps the dimensions first."""
    gate = TensorSpec((128, 256, 4096), stride=(0, 0, 1), device="cuda", values=Generated("randn"))
    x = TensorSpec((128, 256, 4096), device="cuda", values=Generated("randn"))
    case = ReproCase("torch.ops.fused.gated.default", (x, gate))

    def holds(candidate: ReproCase) -> bool:
        return candidate.args[0].numel >= 20_971_520

    later = [p for p in PASSES if p is not merge_dimensions_ahead]
    ends = {}
    for name, passes in (("ahead", PASSES), ("later", later)):
        shrinker = Shrinker(case, holds, passes=passes, runner=ThreadedChecks(holds, 4), ways=4)
        best = shrinker.run()
        ends[name] = ([spec.shape for _, spec in best.tensors()], shrinker.checks)
    assert ends["ahead"][0] == ends["later"][0] == [(20_971_520,), (1,)]
    assert ends["ahead"][1] < ends["later"][1] * 0.7, ends
    seen: list[ReproCase] = []
    Shrinker(case, lambda c: seen.append(c) or holds(c), passes=PASSES).run()  # one at a time
    first_merged = next(i for i, c in enumerate(seen) if len(c.args[0].shape) == 1)
    assert any(len(c.args[0].shape) == 3 and c.args[0].numel < x.numel for c in seen[:first_merged])


def test_a_kernel_that_needs_the_shape_keeps_it_and_a_strided_or_captured_tensor_is_left_alone():
    shaped = TensorSpec((4, 8), values=Generated("randn"))
    strided = TensorSpec((4, 8), stride=(1, 4), values=Generated("randn"))
    case = ReproCase("torch.mm", (shaped, strided))
    seen: list[ReproCase] = []

    def holds(candidate: ReproCase) -> bool:
        seen.append(candidate)
        return all(len(spec.shape) == 2 for _, spec in candidate.tensors())

    best = Shrinker(case, holds, passes=[merge_dimensions]).run()
    assert best == case
    assert all(spec.shape in ((4, 8), (32,)) for c in seen for _, spec in c.tensors())
    assert all(c.args[1] == strided for c in seen)  # its strides are its layout
