"""Which smaller values an integer (a constant of a script, a dimension of a captured call) is
offered, round by round: few checks for an integer the failure needs, few rounds for one it
does not.

Each round's values are checked side by side and tried smallest first, so a round's accepted
value is the smallest of its values that still fails; a round costs one check's wall time.
On the H200 rounds, not checks, set a memory fault's shrink time: `n = 268435456` whose fault
needs `n > 5242880` took 17 rounds of accepted values one after another (27 s of a 117 s
reduction) when each round halved it or cut the span below it four ways down to the exact
threshold. Two changes make it about six:

- values are round (`is_round`: at most three significant binary digits, every integer below
  8): a maintainer reads `n = 6291456` as well as `n = 5242881`, and between 4 Mi and 8 Mi
  there are three such values, not four million;
- once a first smaller value is accepted, the span below is cut on a log scale while it spans
  more than a factor of four (a size that fails at 5 Mi of 256 Mi is found in two rounds, not
  six halvings), evenly after that.

An integer the failure needs costs one round of three checks: its smallest value, half of it
and the round value below it (`first_integers`).
"""

from __future__ import annotations

import math

from reprocut.source.speculation import span_cuts

ROUND_BITS = 3  # significant binary digits of a round value: 4 per octave (1, 1.25, 1.5, 1.75)


def is_round(value: int) -> bool:
    """At most ROUND_BITS significant binary digits (every integer below 2**ROUND_BITS is)."""
    if value < 0:
        return False
    if value < 1 << ROUND_BITS:
        return True
    trailing = (value & -value).bit_length() - 1
    return value.bit_length() - trailing <= ROUND_BITS


def round_down(value: int) -> int:
    """The largest round value <= `value` (`value` itself when round)."""
    if value < 1 << ROUND_BITS:
        return value
    drop = value.bit_length() - ROUND_BITS
    return (value >> drop) << drop


def round_below(value: int) -> int:
    """The largest round value < `value` (-1 below 0): an integer's "one less"."""
    return round_down(value - 1) if value > 0 else -1


def first_integers(value: int, low: int = -1) -> list[int]:
    """An integer's first values, before any search: its smallest (0, or 1 where 0 is known
    not to fail), half of it and the round value below it, each above `low` (known not to
    fail). All three rejected: the integer is one the failure needs, after three checks."""
    options = [c for c in (0, 1) if low < c < value][:1]
    for candidate in (round_down(value // 2), round_below(value)):
        if max(low, *options, -1) < candidate < value:
            options.append(candidate)
    return options


def searches_below(value: int, accepted: int) -> bool:
    """Was `accepted`, among `first_integers(value)`, more than its smallest? Then the span
    below it is searched next (`smaller_integers`), not halved round by round."""
    return accepted > 1 and accepted < value


def smaller_integers(value: int, low: int = -1, ways: int = 2) -> list[int]:
    """A search round above `low` (known not to fail): 0 and 1 when not known, `ways` - 1 cuts
    of the span between them and `value` (on a log scale while it spans more than a factor of
    four) and the round value below `value`, all round, in order. Accepting one leaves the
    value before it as the new `low`; all rejected, `value` is the smallest round value that
    fails (for a failure that needs a large enough value)."""
    options = [c for c in (0, 1) if low < c < value]
    floor = max(low, *options, 0)
    cuts = (
        _log_cuts(floor, value, ways)
        if value > 4 * max(floor, 1)
        else span_cuts(floor, value, ways)
    )
    last = round_below(value)
    for candidate in sorted({*(round_down(c) for c in cuts), last}):
        if max(low, *options, -1) < candidate < value:
            options.append(candidate)
    return options


def _log_cuts(floor: int, value: int, ways: int) -> list[int]:
    base, top = math.log(max(floor, 1)), math.log(value)
    ways = max(2, ways)
    return [int(math.exp(base + (top - base) * k / ways)) for k in range(1, ways)]
