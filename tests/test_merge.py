"""Candidates of one pass laid over one another (reprocut.source.merge), and the reduction that
takes several of them in one check."""

from __future__ import annotations

import itertools
import textwrap
import time

from hypothesis import given
from hypothesis import strategies as st
from pure_candidates import BAD, failure_of

from reprocut.model.case import Signature
from reprocut.source import speculation
from reprocut.source.fixed_point import SourceReducer
from reprocut.source.merge import apply, edits, merged
from reprocut.source.passes import PassContext, drop_arguments
from reprocut.source.results import SourceAccepted


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


BASE = code("""
    import torch
    x = torch.randn(4, 8, device="cuda", dtype=torch.float32)
    y = launch(x, block=128, grid=4, warps=2)
""")


def test_two_arguments_dropped_on_one_line_are_two_edits_that_merge():
    first = BASE.replace(", warps=2", "")
    other = BASE.replace(", block=128", "")
    assert [e.text for e in edits(BASE, first)] == [""]
    assert merged(BASE, first, [other]) == BASE.replace(", warps=2", "").replace(", block=128", "")


def test_edits_in_different_lines_merge_and_apply_gives_each_candidate_back():
    first = BASE.replace('device="cuda", ', "")
    other = BASE.replace("grid=4", "grid=1")
    assert apply(BASE, edits(BASE, first)) == first
    assert apply(BASE, edits(BASE, other)) == other
    together = merged(BASE, first, [other])
    assert together == first.replace("grid=4", "grid=1")


def test_edits_that_touch_are_not_laid_together():
    first = BASE.replace("grid=4", "grid=2")
    other = BASE.replace("grid=4", "grid=1")  # the same integer, another value
    around = BASE.replace("grid=4, ", "")  # the argument that holds it
    assert merged(BASE, first, [other]) is None
    assert merged(BASE, first, [around]) is None
    # one that touches is left out, a later one that does not is still laid over, side by
    # side with it (`4` -> `2`, then `, warps=2` dropped right after it)
    assert merged(BASE, first, [other, BASE.replace(", warps=2", "")]) == first.replace(
        ", warps=2", ""
    )


def test_a_merge_that_is_not_python_is_none():
    base = "if a:\n    b()\n    c()\n"
    first = base.replace("    b()\n", "")
    other = base.replace("    c()\n", "")
    assert merged(base, first, [other]) is None  # an `if` with an empty body
    assert merged(base, base, [first]) is None  # the first candidate changed nothing


# --- in the reduction ----------------------------------------------------------------------------

SCRIPT = code("""
    def step(a, b=1, c=2, d=3, e=4, f=5, g=6, h=7):
        raise ValueError(f"bad value {a}")


    step(1, b=2, c=3, d=4, e=5, f=6, g=7, h=8)
""")
DROPPED = SCRIPT.replace("step(1, b=2, c=3, d=4, e=5, f=6, g=7, h=8)", "step(1)")


def steady_check(source: str) -> Signature | None:
    """The candidate's failure, each check taking as long: those begun together end together."""
    time.sleep(0.05)
    return failure_of(source)


def reduce(parallel: int, merge: bool) -> tuple[SourceReducer, list[SourceAccepted]]:
    events: list[object] = []
    reducer = SourceReducer(
        best=SCRIPT, expected=BAD, check=steady_check, context=PassContext(),
        passes=(drop_arguments,), parallel=parallel, merge=merge, on_event=events.append,
    )  # fmt: skip
    assert reducer.run() == "fixed point"
    return reducer, [e for e in events if isinstance(e, SourceAccepted)]


def test_candidates_that_reproduce_side_by_side_are_taken_in_one_check(monkeypatch):
    """Seven keyword arguments each droppable: one at a time that is seven acceptances in a
    row, each waiting for its check; merged, fewer, and the same fixed point."""
    monkeypatch.setattr(speculation, "GRACE", 10.0)  # wait for every check begun beside
    one, one_accepted = reduce(1, merge=False)
    many, many_accepted = reduce(4, merge=True)
    assert many.speculation().merges > 0
    assert many.best == one.best == DROPPED
    assert len(one_accepted) == 7 and len(many_accepted) < 7


def test_a_hoisted_expression_is_two_edits_around_it_so_an_edit_inside_merges():
    base = "y = (torch.mm(a, b.t()).argmax(dim=1) == labels).sum()\n"
    hoisted = "y = torch.mm(a, b.t()).argmax(dim=1) == labels\n"
    inside = base.replace("b.t()", "b")
    assert len(edits(base, hoisted)) == 2
    assert merged(base, hoisted, [inside]) == "y = torch.mm(a, b).argmax(dim=1) == labels\n"
    for candidate in (hoisted, inside, base.replace("labels", "l")):
        assert apply(base, edits(base, candidate)) == candidate
        assert apply(base, edits(base, candidate, tail_first=False)) == candidate


TEXT = st.text(alphabet="ab(), =\n", max_size=60)


@given(TEXT, TEXT)
def test_the_edits_found_give_the_candidate_back(base: str, candidate: str):
    """Whatever the texts, and wherever the trimming puts an edit."""
    for tail_first in (True, False):
        found = edits(base, candidate, tail_first)
        assert apply(base, found) == candidate
        assert all(a.end <= b.start for a, b in itertools.pairwise(found))
