"""Failures that are not a torch op's: reported for what they are, without running the script
again (real child processes, CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reprocut.model.errors import ExitCode

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).parent.parent


def test_a_plain_python_error_mid_training_runs_the_script_once(tmp_path):
    starts = tmp_path / "starts.txt"
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--quiet", "--root", str(tmp_path / "rec"),
         str(SCRIPTS / "keyerror_late.py"), str(starts)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == ExitCode.SCRIPT_ERROR, done.stderr
    assert starts.read_text().count("start") == 1, "the script was run more than once"
    assert "rerunning" not in done.stderr + done.stdout
    assert "KeyError: 'momentum'" in done.stdout + done.stderr
