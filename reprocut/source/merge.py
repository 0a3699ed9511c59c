"""Several accepted-alike candidates of one pass as one: their edits of the same best, together.

A pass offers candidates each made from the same best (`Options`), and several that run side by
side often reproduce alike: arguments dropped at different calls, sub-expressions hoisted at
different sites, integers shrunk in different places. Taking them one per check is a chain of
checks, each waiting for the one before (1.4-2.3 s apart on the H200). `merged` lays the edits
each made to the best over one another, where they touch nothing another one changed, so a
single check can take them all; the pass's own next candidates run beside it, in case the edits
do not reproduce together.

Edits are found by text, not by tree: a line diff finds the changed blocks, and each block is
trimmed to the characters that differ, so two edits of one line (two arguments of a launch)
stay apart.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

MAX_BLOCK = 4000  # characters of a changed block beyond which it stays one edit
MIN_EQUAL = 3  # characters an unchanged run needs to split a block's edits


@dataclass(frozen=True, slots=True)
class Edit:
    """Characters `start`..`end` of the best replaced by `text`."""

    start: int
    end: int
    text: str

    def touches(self, other: Edit) -> bool:
        """Overlapping, or starting at one place (an insertion there and another edit):
        laid together, the result would depend on their order. Edits side by side do not
        (`, g=7` and `, h=8` dropped from one call)."""
        overlap = self.start < other.end and other.start < self.end
        return overlap or self.start == other.start


def edits(base: str, candidate: str, tail_first: bool = True) -> list[Edit]:
    """The edits that turn `base` into `candidate`, in order, each as small as the diff finds.

    Where text repeats, an edit has several places: `, g=7, h=8` less `g=7, ` or less `, g=7`.
    `tail_first` trims the common end of a changed block before its start, which puts a
    dropped item's comma before it (`, g=7`, `, h=8`: side by side); without it, after."""
    old, new = base.splitlines(keepends=True), candidate.splitlines(keepends=True)
    offsets = [0, *accumulate(len(line) for line in old)]
    found: list[Edit] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        before, after = "".join(old[i1:i2]), "".join(new[j1:j2])
        if tail_first:
            tail = _common_prefix(before[::-1], after[::-1])
            head = _common_prefix(before[: len(before) - tail], after[: len(after) - tail])
        else:
            head = _common_prefix(before, after)
            tail = _common_prefix(before[head:][::-1], after[head:][::-1])
        inner = _within(before[head : len(before) - tail], after[head : len(after) - tail])
        found += [Edit(offsets[i1] + head + e.start, offsets[i1] + head + e.end, e.text)
                  for e in inner]  # fmt: skip
    return found


def _within(before: str, after: str) -> list[Edit]:
    """One changed block as the edits inside it: `(a + b).sum()` -> `a + b` is `(` and
    `).sum()` dropped, so an edit inside `a + b` stays apart. An equal run shorter than
    MIN_EQUAL does not split (a lone `(` common to two unrelated texts is no anchor)."""
    if not before or not after or len(before) + len(after) > MAX_BLOCK:
        return [Edit(0, len(before), after)]
    spans: list[list[int]] = []  # [i1, i2, j1, j2] of before -> after, coalesced
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if spans and i1 - spans[-1][1] < MIN_EQUAL:
            spans[-1][1], spans[-1][3] = i2, j2
        else:
            spans.append([i1, i2, j1, j2])
    return [Edit(i1, i2, after[j1:j2]) for i1, i2, j1, j2 in spans]


def merged(base: str, first: str, others: Sequence[str]) -> str | None:
    """`first` with each of `others`' edits of `base` laid over it, those that touch no edit
    taken before them (`first`'s, then the others' in order); None when none could be added or
    the result is not Python."""
    taken = edits(base, first)
    if not taken:
        return None
    added = 0
    for other in others:
        for tail_first in (True, False):  # the other's edits in either of their places
            more = edits(base, other, tail_first)
            if more and not any(a.touches(b) for a in taken for b in more):
                taken += more
                added += 1
                break
    if not added:
        return None
    code = apply(base, taken)
    try:
        compile(code, "<merged>", "exec")
    except (SyntaxError, ValueError):
        return None
    return code


def apply(base: str, changes: Sequence[Edit]) -> str:
    """`base` with non-touching `changes` made, from the last to the first."""
    code = base
    for edit in sorted(changes, key=lambda e: e.start, reverse=True):
        code = code[: edit.start] + edit.text + code[edit.end :]
    return code


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
