"""pytest under reprocut: `reprocut record -- pytest ARGS` runs the real pytest on the corpus
suite corpus/pytest_segment_ops (passing tests, one that expects an IndexError under
pytest.raises, one parametrized test that fails in index_add_), names the failing test, and
`shrink` gives a standalone repro.py without pytest or fixtures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.cli import main
from reprocut.model.recording import RunDir
from reprocut.record.parent.launch import parse_launch
from reprocut.report.display.failure import show_failure

CASE = Path(__file__).resolve().parents[1] / "corpus" / "pytest_segment_ops"
NODE = "tests/test_segops.py::test_edges_to_nodes_shape[ring_plus_one]"


@pytest.mark.parametrize(
    "command",
    [
        ["--", "pytest", "-q", "tests"],
        ["--", "py.test", "-q", "tests"],
        ["--", "python", "-m", "pytest", "-q", "tests"],
    ],
)
def test_pytest_commands_run_pytest_as_its_module(command: list[str]):
    launch = parse_launch(command)
    assert (launch.module, launch.args) == ("pytest", ("-q", "tests"))


def run_cli(args: list[str], out: Path, patch: pytest.MonkeyPatch) -> tuple[int, dict]:
    with out.open("w") as stdout:
        patch.setattr("sys.stdout", stdout)
        code = main(args)
    patch.undo()
    return code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict]:
    work = tmp_path_factory.mktemp("suite") / "pytest_segment_ops"
    shutil.copytree(CASE, work)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        command = ["record", "--json", "--quiet", "--root", str(work / "rec"), "--"]
        command += ["pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".", "tests"]
        code, report = run_cli(command, work / "record.json", patch)
    return work, code, report


def test_the_first_test_failing_in_a_torch_op_is_named(recorded):
    work, code, report = recorded
    assert code == 1  # pytest's own exit code: a test failed
    assert report["status"] == "localized" and report["op"] == "aten::index_add_"
    test = report["test"]
    assert test["nodeid"] == NODE
    assert (test["file"], test["line"]) == (str(work / "tests" / "test_segops.py"), 39)
    source = report["source"]
    assert (source["file"], source["line"]) == (str(work / "segops.py"), 8)
    assert "index_add_" in source["text"]
    # the op's record keeps the test's own line it ran from: where a GPU meets the error only at
    # the test's teardown, that is the line reported
    outcome = json.loads((Path(report["run_dir"]) / "record.outcome.json").read_text())
    assert outcome["culprit"]["test_line"] == 39


def test_pytest_output_is_its_own(recorded):
    _, _, report = recorded
    run_dir = Path(report["run_dir"])
    stdout = (run_dir / "record.stdout.txt").read_text()
    assert "1 failed, 5 passed" in stdout  # pytest.raises' test passed; later tests ran
    assert f"FAILED {NODE}" in stdout
    assert "reprocut/record" not in stdout  # no frame of reprocut's modes in pytest's traceback
    assert "handle_torch_function" not in stdout


def test_the_panel_names_the_test_instead_of_a_step(recorded):
    _, _, report = recorded
    from rich.console import Console

    run_dir = Path(report["run_dir"])
    console = Console(record=True, width=100, force_terminal=False)
    show_failure(console, RunDir(run_dir).read_failure(), run_dir)
    text = console.export_text()
    assert f"test     {NODE}" in text and "tests/test_segops.py:39" in text
    assert "step     " not in text


def test_shrink_gives_a_standalone_repro(recorded):
    work, _, report = recorded
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        code, shrunk = run_cli(["shrink", "--json", report["run_dir"]], work / "shrink.json", patch)
    assert code == 0
    assert shrunk["verified"]["reproduced"] == shrunk["verified"]["runs"] > 0
    repro = Path(shrunk["repro"])
    text = repro.read_text()
    assert "pytest" not in text and "segops" not in text and "index_add_" in text
    empty = work / "empty"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, str(repro)], capture_output=True, text=True, timeout=120, cwd=empty
    )
    assert run.returncode != 0 and "out of bounds for dimension 0" in run.stderr
    assert f"test `{NODE}`" in Path(shrunk["report"]).read_text()


def test_an_asynchronous_errors_test_line_is_the_one_the_blocking_rerun_raised_in():
    """On a GPU a device assert is met at the test's teardown (the first run has only the
    `def` line); the blocking rerun raises in the test's line that led to the kernel."""
    from reprocut.model.failing_test import FailingTest, placed

    nodeid = "tests/test_segops.py::test_edges_to_nodes_shape[ring_plus_one]"
    first = FailingTest(nodeid, "/x/tests/test_segops.py", 34, "teardown")
    rerun = {"nodeid": nodeid, "file": first.file, "line": 39, "phase": "call"}
    moved = placed(first, rerun)
    assert moved is not None and (moved.line, moved.phase) == (39, "call")
    assert moved.nodeid == nodeid
    other = {**rerun, "nodeid": "tests/test_segops.py::test_runs_after_the_failure"}
    assert placed(first, other) == first  # another test: the first run's stays
    assert placed(first, None) == first
    assert placed(None, rerun) is None
    # the op's own record of the line it ran from (a snapshot, an in-process culprit)
    from_op = placed(first, None, 39)
    assert from_op is not None and from_op.line == 39
