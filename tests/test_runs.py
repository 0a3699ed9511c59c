"""Recordings on disk: kept out of git, found from sub-folders, listed, the failing one picked
for `shrink`, old ones deleted. Real `reprocut` processes in a scratch project (CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.model.errors import ExitCode

REPO = Path(__file__).parent.parent
SCRIPTS = Path(__file__).parent / "scripts"


def reprocut(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "reprocut", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project that recorded a failing script, then a passing one (the newer run)."""
    root = tmp_path_factory.mktemp("project")
    (root / "sub" / "deeper").mkdir(parents=True)
    for script in ("ce_target.py", "passes.py"):
        shutil.copy(SCRIPTS / script, root / script)
    assert reprocut(root, "record", "--quiet", "ce_target.py").returncode == ExitCode.OK
    assert reprocut(root, "record", "--quiet", "passes.py").returncode == ExitCode.NOT_REPRODUCED
    return root


def listing(cwd: Path, *args: str) -> dict:
    done = reprocut(cwd, "runs", "--json", *args)
    assert done.returncode == ExitCode.OK, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_recordings_are_kept_out_of_git(project):
    assert (project / ".reprocut" / ".gitignore").read_text().splitlines()[-1] == "*"
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=project, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "ce_target.py" in status and ".reprocut" not in status


def test_runs_lists_recordings_from_a_sub_folder(project):
    found = listing(project / "sub" / "deeper")
    assert found["root"] == str((project / ".reprocut").resolve())
    first, second = found["runs"]
    assert (Path(first["script"]).name, first["status"], first["op"], first["step"]) == (
        "ce_target.py", "localized", "aten::nll_loss_forward", 5
    )  # fmt: skip
    assert (Path(second["script"]).name, second["status"]) == ("passes.py", "passed")
    assert found["shrink_default"] == first["id"]
    text = reprocut(project / "sub", "runs")
    assert "ce_target.py" in text.stdout + text.stderr and "localized" in text.stdout + text.stderr


def test_shrink_from_a_sub_folder_takes_the_latest_recording_with_a_failure(project):
    failing = listing(project)["runs"][0]
    done = reprocut(project / "sub", "shrink", "--json", "--runs", "1")
    assert done.returncode == ExitCode.OK, done.stderr
    assert json.loads(done.stdout)["repro"] == str(Path(failing["run_dir"]) / "repro.py")
    assert f"shrinking {failing['id']} (" in done.stderr
    assert "the latest recording with a failure; 1 newer without one (passed)" in done.stderr


def test_shrink_takes_a_root_and_a_run_id(project, tmp_path):
    failing = listing(project)["runs"][0]
    (project / ".reprocut" / "runs" / failing["id"] / "inputs.pt").rename(tmp_path / "inputs.pt")
    try:  # a corrupt recording, found by id under --root: the error names it
        done = reprocut(tmp_path, "shrink", "--json", "--root", str(project / ".reprocut"),
                        failing["id"])  # fmt: skip
    finally:
        (tmp_path / "inputs.pt").rename(
            project / ".reprocut" / "runs" / failing["id"] / "inputs.pt"
        )
    assert done.returncode == ExitCode.USAGE_ERROR
    assert json.loads(done.stdout)["status"] == "corrupt-recording"
    assert failing["id"] in json.loads(done.stdout)["message"]


def test_shrink_without_any_recording_says_so(tmp_path):
    done = reprocut(tmp_path, "shrink", "--json")
    assert done.returncode == ExitCode.USAGE_ERROR
    assert json.loads(done.stdout)["status"] == "no-recording"


def test_runs_clean_keeps_the_newest(project):
    before = listing(project)["runs"]
    cleaned = listing(project, "--clean", "--keep", "1")
    assert cleaned["deleted"] == [before[0]["id"]] and cleaned["kept"] == [before[1]["id"]]
    assert [run["id"] for run in listing(project)["runs"]] == [before[1]["id"]]
    assert not Path(before[0]["run_dir"]).exists()
