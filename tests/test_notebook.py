"""Notebooks: `reprocut record train.ipynb` runs the code cells in order, as Run All would,
and names places as cells; the repro is the usual standalone repro.py.

The end-to-end notebook (tests/scripts/notebook_labels.ipynb) has markdown cells between its
code cells, a line magic, a shell line and a `%%time` cell (IPython is not installed here: they
are skipped with a note, or run as code), and fails in its fourth code cell (cell 6, In [4]).
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.cli import main
from reprocut.model.cell_code import translate_cell
from reprocut.model.errors import ExitCode
from reprocut.model.notebook import (
    as_script,
    cell_filename,
    code_cells,
    place_of,
    read_cells,
    split_cell_filename,
)

NOTEBOOK = Path(__file__).parent / "scripts" / "notebook_labels.ipynb"


def test_code_cells_are_numbered_as_a_fresh_run_all_numbers_them():
    cells = read_cells(NOTEBOOK)
    assert [cell.kind for cell in cells][:3] == ["markdown", "code", "markdown"]
    assert [(cell.index, cell.number) for cell in code_cells(NOTEBOOK)] == [
        (1, 1),
        (3, 2),
        (4, 3),
        (6, 4),
        (7, 5),
    ]


def test_a_cells_filename_maps_back_to_the_notebook_and_cell():
    name = cell_filename(str(NOTEBOOK), 6)
    assert split_cell_filename(name) == (str(NOTEBOOK), 6)
    assert split_cell_filename("/x/train.py") is None
    place = place_of(name, 3)
    assert place is not None
    assert place.describe(str(NOTEBOOK.parent)) == "notebook_labels.ipynb, cell 6 (In [4]), line 3"


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("x = 1 % 2\n", "x = 1 % 2\n"),  # Python stays as written
        ("%pip install foo\nimport os", "_reprocut_magic('line', 'pip', 'install foo')\nimport os"),
        ("out = !ls -l\n", "out = _reprocut_magic('getoutput', '', 'ls -l')\n"),
        ("for i in range(2):\n    %time y = i\n", "for i in range(2):\n    y = i\n"),
        ("%timeit -n 3 y = 1\n", "y = 1\n"),
        ("%%time\nx = 1\ny = x\n", "\nx = 1\ny = x\n"),
        ("%%bash\necho hi\n", "_reprocut_magic('cell', 'bash', '', 'echo hi\\n')\n\n"),
    ],
)
def test_magics_are_translated_line_for_line(cell: str, expected: str):
    code = translate_cell(cell).code
    assert code == expected
    assert code.count("\n") == cell.count("\n")
    ast.parse(code)


def test_the_notebook_as_one_script_compiles_for_the_source_reducer():
    script = as_script(NOTEBOOK)
    ast.parse(script)
    assert "# cell 6 (In [4])" in script
    assert "%" not in script.split("# cell 1 (In [1])", 1)[1].splitlines()[1]


def test_a_notebook_is_recorded_by_cell_and_shrunk_to_a_verified_repro(tmp_path, monkeypatch):
    notebook = tmp_path / "train.ipynb"
    shutil.copy(NOTEBOOK, notebook)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "stdout.json"
    with out.open("w") as stdout:
        monkeypatch.setattr("sys.stdout", stdout)
        code = main(
            [
                "record",
                "--json",
                "--quiet",
                "--shrink",
                "--root",
                str(tmp_path / "rec"),
                "train.ipynb",
            ]
        )
    report = json.loads(out.read_text())
    assert code == ExitCode.OK
    assert report["op"] == "aten::nll_loss_forward"
    assert report["source"]["file"] == str(notebook)
    assert (report["source"]["cell"], report["source"]["line"]) == (6, 3)
    assert report["source"]["text"].startswith("loss = F.cross_entropy(logits, labels[step])")
    assert report["step"] == 5 and report["loop"] == {"step": 5}
    shrink = report["shrink"]
    assert shrink["verified"]["reproduced"] == shrink["verified"]["runs"] > 0
    repro = Path(shrink["repro"])
    assert "ipynb" not in repro.read_text()  # standalone: no notebook, no cells
    run = subprocess.run(
        [sys.executable, str(repro)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert run.returncode != 0 and "Target 4 is out of bounds" in run.stderr
    markdown = Path(shrink["report"]).read_text()
    assert "train.ipynb, cell 6 (In [4]), line 3" in markdown


def test_every_panel_names_a_notebook_line_by_its_cell():
    """The failure, NaN and memory panels name a line through one function: a notebook's as
    its cell, a script's as its path."""
    from reprocut.model.case import SourceLocation
    from reprocut.report.display.memory import _line
    from reprocut.report.paths import where_text

    cell = SourceLocation(cell_filename(str(NOTEBOOK), 6), 3, "x = 1")
    assert (
        where_text(cell, str(NOTEBOOK.parent)) == "notebook_labels.ipynb, cell 6 (In [4]), line 3"
    )
    assert _line(cell) == "notebook_labels.ipynb, cell 6 (In [4]), line 3"
    script = SourceLocation("/work/proj/train.py", 41, "loss.backward()")
    assert where_text(script, "/work/proj") == "train.py:41"
    assert _line(script) == "train.py:41"
    assert where_text(None) == "?" and where_text(None, missing="unknown") == "unknown"
