"""Tables whose words stay whole at any terminal width.

rich shrinks an over-wide table by narrowing its widest columns, below their longest word if need
be, and then folds words mid-way ("contiguou" / "s" at 80 columns). Here the widths are chosen
at render time, when the room is known: every column starts at its longest word and the room
left goes to the columns that would wrap, so text only ever wraps between words. Only when even
the longest words do not fit, the vertical rules go; then cells are cut, with an ellipsis, never
folded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text


class FittedTable:
    """A rich Table of plain-text cells, laid out to the width it is rendered at."""

    def __init__(self, headers: Sequence[str], rows: Iterable[Sequence[str]], **table: Any) -> None:
        self.headers = tuple(headers)
        self.rows = [tuple(row) for row in rows]
        self.table = table  # Table(...) options: title, box, ...

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.build(options.max_width)

    def build(self, width: int) -> Table:
        columns = list(zip(self.headers, *self.rows, strict=True))
        longest_word = [max(_longest_word(cell) for cell in column) for column in columns]
        natural = [max(len(cell) for cell in column) for column in columns]
        widths: list[int] | None = None  # None: even single words do not fit: cut, never fold
        for style in (self.table, {**self.table, "box": box.SIMPLE_HEAD, "show_edge": False}):
            table = Table(**style)  # boxed if it fits; else without vertical rules
            room = width - _chrome(table, len(columns))
            if sum(natural) <= room:
                widths = natural
            elif sum(longest_word) <= room:
                widths = _spread(longest_word, natural, room)
            if widths is not None:
                break
        cut = widths is None
        if widths is None:  # the widest columns give up characters first
            widths = _narrowed(longest_word, room)
        for index, header in enumerate(self.headers):
            table.add_column(header, width=widths[index], no_wrap=cut, overflow="ellipsis")
        for row in self.rows:
            table.add_row(*(Text(cell) for cell in row))  # text, never markup
        return table


def _longest_word(cell: str) -> int:
    return max((len(word) for word in cell.split()), default=0)


def _chrome(table: Table, count: int) -> int:
    """Columns of a table's borders and padding around `count` columns of text."""
    left, right = table.padding[3], table.padding[1]
    padding = (left + right) * count
    if table.box is None:
        return padding
    edges = 2 if table.show_edge else 0
    return padding + edges + (count - 1)


def _spread(minimum: list[int], natural: list[int], room: int) -> list[int]:
    """Widths from each column's minimum towards its natural width: the room left goes first
    to the columns that need the least to fit unwrapped, so that as few as possible wrap."""
    widths = list(minimum)
    spare = room - sum(widths)
    for index in sorted(range(len(widths)), key=lambda i: natural[i] - minimum[i]):
        grow = min(spare, natural[index] - widths[index])
        widths[index] += grow
        spare -= grow
    return widths


def _narrowed(widths: list[int], room: int) -> list[int]:
    """Widths that fit `room`, taken one character at a time from the widest column."""
    widths = list(widths)
    while sum(widths) > room and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    return widths
