"""A Jupyter notebook as reprocut runs it: its code cells in order, as "Run All" would.

Each code cell is compiled under a name of its own, `<notebook path>#cell<index>` (the index in
the notebook's cells list, 0-based, markdown cells counted), so a frame's file and line are the
cell and the line within it; `place_of` turns them back into "train.ipynb, cell 7 (In [5]),
line 3". In [n] is the code cell's number in a fresh Run All (the first code cell is In [1]),
not the count saved in the file, which depends on how the notebook was last run.
The notebook is read with json alone (nbformat is not needed).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

from reprocut.model.cell_code import translate_cell
from reprocut.model.errors import ReprocutError

NOTEBOOK_SUFFIX = ".ipynb"
CELL_MARK = "#cell"


class NotebookError(ReprocutError):
    slug = "bad-notebook"


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell: its index in the cells list, In [n] for a code cell (None for markdown)."""

    index: int
    kind: str  # "code", "markdown", "raw"
    source: str
    number: int | None = None


@dataclass(frozen=True, slots=True)
class NotebookPlace:
    """A line of a notebook's code cell."""

    notebook: str
    cell: int
    number: int | None  # In [n]
    line: int  # 1-based within the cell

    def describe(self, base: str = "") -> str:
        """`train.ipynb, cell 7 (In [5]), line 3`, the notebook relative to `base`."""
        shown = self.notebook
        if base and shown.startswith(base.rstrip(os.sep) + os.sep):
            shown = shown[len(base.rstrip(os.sep)) + 1 :]
        number = f" (In [{self.number}])" if self.number is not None else ""
        return f"{shown}, cell {self.cell}{number}, line {self.line}"


def is_notebook(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(NOTEBOOK_SUFFIX)


def read_cells(path: str | os.PathLike[str]) -> tuple[Cell, ...]:
    """The notebook's cells, code cells numbered as a fresh Run All numbers them."""
    try:
        data = json.loads(open(path, encoding="utf-8").read())  # noqa: SIM115
    except (OSError, ValueError) as exc:
        raise NotebookError(f"cannot read notebook {path}: {exc}") from exc
    raw_cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(raw_cells, list):
        raise NotebookError(
            f"{path} is not a Jupyter notebook (no cells list)",
            hint="reprocut reads notebooks in nbformat 4 (.ipynb files Jupyter writes)",
        )
    cells: list[Cell] = []
    number = 0
    for index, raw in enumerate(raw_cells):
        kind = str(raw.get("cell_type", "code"))
        source = raw.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        if kind == "code":
            number += 1
        cells.append(Cell(index, kind, text, number if kind == "code" else None))
    return tuple(cells)


def code_cells(path: str | os.PathLike[str]) -> tuple[Cell, ...]:
    return tuple(cell for cell in read_cells(path) if cell.kind == "code")


def cell_filename(notebook: str, index: int) -> str:
    """The name a cell's code is compiled under: frames and tracebacks carry it."""
    return f"{notebook}{CELL_MARK}{index}"


def split_cell_filename(filename: str) -> tuple[str, int] | None:
    """(notebook, cell index) of a cell's filename; None for any other file."""
    head, mark, tail = filename.rpartition(CELL_MARK)
    if not mark or not head.endswith(NOTEBOOK_SUFFIX) or not tail.isdigit():
        return None
    return head, int(tail)


@lru_cache(maxsize=16)
def _cells_cached(notebook: str, mtime: float) -> tuple[Cell, ...]:
    return read_cells(notebook)


def _cells_of(notebook: str) -> tuple[Cell, ...] | None:
    try:
        return _cells_cached(notebook, os.path.getmtime(notebook))
    except (OSError, NotebookError):
        return None


def place_of(filename: str, line: int) -> NotebookPlace | None:
    """The notebook place of a frame's file and line; None when it is no notebook cell."""
    split = split_cell_filename(filename)
    if split is None:
        return None
    notebook, index = split
    cells = _cells_of(notebook)
    number = cells[index].number if cells is not None and index < len(cells) else None
    return NotebookPlace(notebook, index, number, line)


def cell_source(filename: str) -> str | None:
    """The source the user wrote in the cell a filename names (None: no notebook cell)."""
    split = split_cell_filename(filename)
    if split is None:
        return None
    cells = _cells_of(split[0])
    if cells is None or split[1] >= len(cells):
        return None
    return cells[split[1]].source


def source_line(filename: str, line: int) -> str | None:
    """The stripped text of a cell's line; None when `filename` is no notebook cell."""
    source = cell_source(filename)
    if source is None:
        return None
    lines = source.splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def as_script(path: str | os.PathLike[str]) -> str:
    """The notebook's code cells as one script (magics translated, as the run translates
    them), each headed by a `# cell N (In [n])` comment: what the source reducer reduces."""
    parts = []
    for cell in code_cells(path):
        parts.append(
            f"# cell {cell.index} (In [{cell.number}])\n{translate_cell(cell.source).code}"
        )
    return "\n\n".join(part.rstrip("\n") for part in parts) + "\n"
