"""End to end under the frameworks people train with: the HF Trainer and Lightning (tiny models
built from config objects, no downloads), and a loop whose optimizer starts after a warm-up.

Each script is recorded once (module-scoped); the terminal panel, failure.json, `--json` and
report.md are then read for what each framework used to hide: the call site inside
transformers, a module path that exists, the phase inside Lightning's closure, the versions of
the frameworks imported, and the user's own loop counters.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from reprocut.cli import main
from reprocut.model.errors import ExitCode
from reprocut.model.recording import RunDir
from reprocut.report.display.failure import show_failure
from reprocut.report.markdown import ReportInputs, collect_environment, render

SCRIPTS = Path(__file__).parent / "scripts"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def need(module: str) -> None:
    """The framework, installed by the test extra: missing in CI is a failure, not a skip."""
    if os.environ.get("CI"):
        importlib.import_module(module)
    else:
        pytest.importorskip(module)


def record(workdir: Path, *args: str) -> tuple[int, dict]:
    """`reprocut record --json` in-process, from `workdir`; the JSON report on stdout."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        for name, value in OFFLINE.items():
            patch.setenv(name, value)
        out = workdir / "stdout.json"
        with out.open("w") as stdout:
            patch.setattr("sys.stdout", stdout)
            code = main(["record", "--json", "--quiet", "--root", str(workdir / "rec"), *args])
    return code, json.loads(out.read_text())


def panel_text(report: dict) -> str:
    run_dir = Path(report["run_dir"])
    console = Console(record=True, width=100, force_terminal=False)
    show_failure(console, RunDir(run_dir).read_failure(), run_dir)
    return console.export_text()


def report_md(report: dict) -> str:
    failure = RunDir(Path(report["run_dir"])).read_failure()
    inputs = ReportInputs(
        code="import torch\n",
        failure=failure,
        environment=collect_environment(failure),
        statements=1,
        tensor_elements=1,
        checks=1,
        seconds=0.1,
        verified_runs=1,
        verified_reproduced=1,
        cpu_reproduces=None,
    )
    return render(inputs)


def line_of(path: Path, needle: str) -> int:
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if needle in text:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


@pytest.fixture(scope="module")
def hf_trainer(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict]:
    need("transformers")
    need("accelerate")
    workdir = tmp_path_factory.mktemp("hf")
    return record(workdir, str(SCRIPTS / "hf_trainer_bert.py"), str(workdir / "out"))


@pytest.fixture(scope="module")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict]:
    need("lightning")
    return record(tmp_path_factory.mktemp("pl"), str(SCRIPTS / "lightning_ce.py"))


@pytest.fixture(scope="module")
def warmup(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict]:
    return record(tmp_path_factory.mktemp("warmup"), str(SCRIPTS / "warmup_loop.py"))


def test_hf_trainer_names_the_call_site_inside_transformers(hf_trainer):
    code, report = hf_trainer
    assert code == ExitCode.OK and report["status"] == "localized"
    assert report["op"] == "aten::nll_loss_forward"
    script = SCRIPTS / "hf_trainer_bert.py"
    assert report["source"]["line"] == line_of(script, "trainer.train()")  # all the user wrote
    site = report["call_site"]
    assert site["file"].endswith(os.path.join("transformers", "models", "bert", "modeling_bert.py"))
    assert "loss_fct(" in site["text"]
    assert Path(site["file"]).read_text().splitlines()[site["line"] - 1].strip() == site["text"]
    failure = RunDir(Path(report["run_dir"])).read_failure()
    assert failure.call_site is not None and failure.call_site.line == site["line"]
    assert "torch called from transformers/models/bert/modeling_bert.py:" in panel_text(report)
    assert f"torch called from `transformers/models/bert/modeling_bert.py:{site['line']}`" in (
        report_md(report)
    )


def test_hf_trainer_module_path_exists(hf_trainer):
    _, report = hf_trainer
    # the loss is a CrossEntropyLoss() made inside BertForSequenceClassification.forward: it is
    # no submodule, so the path is its nearest real parent, the model the user named `model`
    assert report["module"] == "model"


def test_hf_trainer_report_lists_the_imported_frameworks_without_home_paths(hf_trainer):
    import accelerate
    import transformers

    _, report = hf_trainer
    assert report["frameworks"]["transformers"] == transformers.__version__
    assert report["frameworks"]["accelerate"] == accelerate.__version__
    assert "lightning" not in report["frameworks"]  # installed, but this script never imported it
    text = report_md(report)
    assert f"- transformers: {transformers.__version__}" in text
    assert f"`hf_trainer_bert.py:{report['source']['line']}`" in text  # relative to its folder
    assert str(SCRIPTS) not in text
    assert os.path.expanduser("~") + os.sep not in text


def test_lightning_training_step_is_forward_not_optimizer(lightning):
    code, report = lightning
    assert code == ExitCode.OK and report["status"] == "localized"
    assert report["op"] == "aten::nll_loss_forward"
    assert report["phase"] == "forward"  # inside optimizer.step(closure), yet the user's forward
    assert report["step"] == 4
    script = SCRIPTS / "lightning_ce.py"
    assert report["source"]["line"] == line_of(script, "loss = F.cross_entropy")
    assert report["call_site"]["line"] == report["source"]["line"]  # the user called torch
    assert "torch called from" not in panel_text(report)  # nothing to add beside the user's line
    assert report["frameworks"]["lightning"]
    assert "- lightning: " in report_md(report)


def test_loop_counters_are_reported_beside_the_optimizer_step(warmup):
    code, report = warmup
    assert code == ExitCode.OK
    assert report["step"] == 9  # optimizer steps: the first 10 transitions were a warm-up
    assert report["loop"] == {"episode": 2, "t": 3}
    assert "your loop: episode=2, t=3" in panel_text(report)
    assert "- your loop counters: `episode=2, t=3`" in report_md(report)


def test_while_loop_counters_are_reported_at_the_users_step(tmp_path):
    code, report = record(tmp_path, str(SCRIPTS / "while_counter.py"))
    assert code == ExitCode.OK and report["op"] == "aten::embedding"
    assert report["loop"] == {"step": 7}  # the user's step, beside reprocut's optimizer step
    assert report["step"] == 7
    assert "your loop: step=7" in panel_text(report)
