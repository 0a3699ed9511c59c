"""What people read: the traceback as plain python shows it, tables at 80 columns, summaries
off a terminal, no torch import noise from reprocut's own processes (real processes, CPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from reprocut.model.recording import RunDir
from reprocut.report.display.failure import failure_panel

REPO = Path(__file__).parent.parent
SCRIPT = Path(__file__).parent / "scripts" / "ce_target.py"
NUMPY_WARNING = "Failed to initialize NumPy"
WORDS = ("contiguous", "captured", "float32", "target")
HEADERS = {"arg", "shape", "dtype", "stride", "offset", "device", "values"}


def frames(stderr: str) -> list[str]:
    """The `File ..., line N, in f` lines of the first traceback in `stderr`."""
    text = stderr[stderr.index("Traceback (most recent call last):") :]
    return [line.strip() for line in text.splitlines() if line.startswith('  File "')]


@pytest.fixture(scope="module")
def without_numpy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment in which `import numpy` fails, as in a fresh venv without it: torch then
    warns "Failed to initialize NumPy" in every process that imports it."""
    hidden = tmp_path_factory.mktemp("no-numpy")
    (hidden / "numpy").mkdir()
    (hidden / "numpy" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n'
    )
    path = os.pathsep.join([str(REPO), str(hidden), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, without_numpy) -> tuple[dict, str]:
    """`reprocut record --quiet` on a failing script, numpy missing, stderr not a terminal."""
    root = tmp_path_factory.mktemp("rec")
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--json", "--quiet", "--root", str(root),
         str(SCRIPT)],
        cwd=REPO, env=without_numpy, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return json.loads(done.stdout), done.stderr


def test_the_traceback_shows_the_frames_plain_python_shows(tmp_path):
    plain = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120
    )
    recorded = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--root", str(tmp_path), str(SCRIPT)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert frames(recorded.stderr) == frames(plain.stderr)
    assert "__torch_function__" not in recorded.stderr
    assert "handle_torch_function" not in recorded.stderr


def test_reprocut_record_does_not_warn_about_numpy_even_when_quiet(recorded):
    report, stderr = recorded
    assert report["status"] == "localized", stderr
    assert NUMPY_WARNING not in stderr


def test_shrink_summary_off_a_terminal_is_unwrapped_and_never_repeats(recorded, without_numpy):
    report, _ = recorded
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "shrink", report["run_dir"]],
        cwd=REPO, env=without_numpy, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert NUMPY_WARNING not in done.stderr
    lines = done.stderr.splitlines()
    summary = next(line for line in lines if line.startswith("repro: "))
    assert re.search(r"\(3 statements, \d+ tensor elements; \d+ checks, [\d.]+ s\)$", summary)
    assert next(i for i, line in enumerate(lines) if line.startswith("verified: ")) == (
        lines.index(summary) + 1
    ), "the summary was wrapped onto more lines"
    accepted = [re.sub(r" \(.*\)$", "", line) for line in lines if line.startswith("✓ ")]
    assert accepted and len(accepted) == len(set(accepted)), accepted


def render(failure, width: int) -> str:
    console = Console(width=width, force_terminal=False, no_color=True, record=True)
    console.print(failure_panel(failure, Path("run")))
    return console.export_text()


def table_tokens(failure, width: int) -> tuple[set[str], str]:
    text = render(failure, width)
    table = text[text.index("inputs of the faulting call") : text.index("what explains it")]
    return set(re.findall(r"[^\s│┃━─┏┓┗┛┡┩┳╇┻└┘┴]+", table)), table


def folded(tokens: set[str]) -> set[str]:
    """Pieces of a word split over lines (a word cut with an ellipsis is not one)."""
    pieces = tokens - HEADERS
    return {t for t in pieces if not t.endswith("…") and any(t != w and t in w for w in WORDS)}


def embedding_like(failure):
    """The recorded failure with the embedding example's inputs: at 80 columns rich folded
    "contiguous" in their table."""
    first, second = failure.tensors
    return replace(
        failure,
        tensors=(
            replace(first, name="weight", spec=replace(first.spec, shape=(1000, 64))),
            replace(second, name="target", spec=replace(second.spec, shape=(8, 32))),
        ),
    )


@pytest.mark.parametrize("width", [80, 100])
def test_table_cells_never_break_mid_word(recorded, width):
    failure = embedding_like(RunDir(Path(recorded[0]["run_dir"])).read_failure())
    tokens, table = table_tokens(failure, width)
    assert set(WORDS) <= tokens and not folded(tokens), f"at {width} columns:\n{table}"


def test_narrow_tables_cut_words_with_an_ellipsis_never_fold_them(recorded):
    failure = RunDir(Path(recorded[0]["run_dir"])).read_failure()
    tokens, table = table_tokens(failure, 50)
    assert any(token.endswith("…") for token in tokens), table
    assert not folded(tokens), table


def test_shrink_progress_is_a_bar_on_a_terminal_and_plain_lines_off_it():
    """On a terminal: a bar of the size cut so far, with the checks and the best's size; off
    it, no bar, only a line per accepted step (the same lines on a terminal)."""
    import io

    from reprocut.report.display.shrink import shrink_display
    from reprocut.source.results import SourceAccepted, SourceChecked

    events = [
        SourceChecked("jump_to_call", 1, True, 40),
        SourceAccepted("jump_to_call", "x = 1\n", 40, 1),
        SourceChecked("delete_statements", 2, False, 40),
        SourceChecked("delete_statements", 3, True, 10),
        SourceAccepted("delete_statements", "x\n", 10, 3),
    ]
    shown = {}
    for terminal in (True, False):
        stream = io.StringIO()
        console = Console(file=stream, force_terminal=terminal, width=100)
        with shrink_display(console) as on_event:
            for event in events:
                on_event(event)
        shown[terminal] = stream.getvalue()
    assert "━" in shown[True] and "3 checks · delete_statements" in shown[True]
    assert "10 lines" in shown[True]
    assert "━" not in shown[False] and "checks ·" not in shown[False]
    assert shown[False].splitlines() == [
        "✓ jump_to_call → 40 lines (1 check)", "✓ delete_statements → 10 lines (3 checks)"
    ]  # fmt: skip


def test_the_last_accepted_step_is_printed_before_the_phase_after_the_shrink():
    """A step is printed once the pass or the size moves on; the last one once the shrink's
    phase ends, so "verifying" never comes before the step that made the repro."""
    import io

    from reprocut.pipeline.phases import PhaseEvent
    from reprocut.report.display.shrink import print_phase, shrink_display
    from reprocut.source.results import SourceAccepted

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=False, width=100)
    with shrink_display(console) as on_event:
        on_event(SourceAccepted("drop_arguments", "x\n", 3, 7))
        on_event(PhaseEvent("source_reduce", 12.0))
        print_phase(console, "verifying: 3 plain runs of python repro.py")
    assert stream.getvalue().splitlines() == [
        "✓ drop_arguments → 3 lines (7 checks)",
        "· verifying: 3 plain runs of python repro.py",
    ]
