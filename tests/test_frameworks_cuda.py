"""The frameworks' end-to-end checks on a GPU, where the culprit comes from snapshot replay:
the call site and the loop counters must then come from the snapshot taken before the fault."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.model.errors import ExitCode

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.cuda


def record(tmp_path: Path, *args: str) -> tuple[int, dict]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [sys.executable, "-m", "reprocut", "record", "--json", "--quiet", "--timeout", "240"]
    done = subprocess.run(
        [*command, "--root", str(tmp_path / "rec"), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=env,
    )
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    report["_stderr"] = done.stderr
    return done.returncode, report


def test_hf_trainer_on_cuda_names_the_call_site_from_the_snapshot(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    script = SCRIPTS / "hf_trainer_bert.py"
    code, report = record(tmp_path, str(script), str(tmp_path / "out"), "cuda")
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["op"] == "aten::nll_loss_forward"
    assert report["error"]["code"] == 710, (report["error"], report["_stderr"][-3000:])
    assert report["module"] == "model"
    site = report["call_site"]
    assert site["file"].endswith(os.path.join("transformers", "models", "bert", "modeling_bert.py"))
    assert "loss_fct(" in site["text"]


def test_loop_counters_of_a_late_cuda_fault_are_those_of_its_step(tmp_path):
    script = SCRIPTS / "cuda_embedding_late.py"
    code, report = record(tmp_path, str(script))
    assert code == ExitCode.OK, report["_stderr"][-3000:]
    assert report["step"] == 7
    assert report["loop"] == {"step": 7}  # not the step at which the error surfaced
    assert report["call_site"]["line"] == report["source"]["line"]
