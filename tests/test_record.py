"""`reprocut record` end to end on real scripts in real child processes (CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from reprocut.cli import main
from reprocut.model.errors import ExitCode
from reprocut.model.recording import RunDir

SCRIPTS = Path(__file__).parent / "scripts"
EXAMPLES = Path(__file__).parent.parent / "examples"


def record(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["record", "--json", "--quiet", "--root", str(tmp_path / "rec"), *args])
    captured = capsys.readouterr()
    report = json.loads(captured.out) if captured.out.strip() else {}
    report["_stderr"] = captured.err
    return code, report


def line_of(path: Path, needle: str) -> int:
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if needle in text:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def test_embedding_example_is_localized_with_facts(tmp_path, capsys):
    script = EXAMPLES / "train_embedding.py"
    code, report = record(tmp_path, capsys, str(script))
    assert code == ExitCode.OK
    assert report["status"] == "localized"
    assert report["op"] == "aten::embedding"
    assert report["public_call"] == "torch.nn.functional.embedding"
    assert report["phase"] == "forward"
    assert report["source"]["file"] == str(script.resolve())
    assert "embed" in report["source"]["text"] or "embed" in (report["module"] or "")
    assert any("≥" in fact for fact in report["facts"])
    assert report["signature"]["kind"] == "index out of range in self"
    run_dir = RunDir(Path(report["run_dir"]))
    failure = run_dir.read_failure()
    assert failure.cases and failure.cases[0].target == "torch.nn.functional.embedding"
    inputs = torch.load(run_dir.inputs_path, weights_only=True)
    assert inputs, "captured inputs must be saved"
    steps = [r for r in run_dir.read_trace() if r["type"] == "step"]
    assert len(steps) == report["step"], "every completed step is in the trace"
    meta = run_dir.read_meta()  # where the time went, for the benchmarks
    assert meta["status"] == "localized" and meta["seconds"] > 0 and meta["localize_seconds"] >= 0
    # the script's run split at the moment its failure was known
    assert 0 < meta["failed_after_seconds"] <= meta["seconds"]
    assert meta["exit_after_failure_seconds"] >= 0


def test_cross_entropy_target_names_step_module_and_value(tmp_path, capsys):
    script = SCRIPTS / "ce_target.py"
    code, report = record(tmp_path, capsys, str(script))
    assert code == ExitCode.OK
    assert report["op"] == "aten::nll_loss_forward"
    assert report["public_call"] == "torch.nn.functional.cross_entropy"
    assert report["step"] == 5
    assert report["source"]["line"] == line_of(script, "loss = F.cross_entropy")
    assert any("target max 10 ≥ 10 classes at [3]" in fact for fact in report["facts"])
    assert report["signature"]["kind"] == "Target <n> is out of bounds."


def test_one_hot_is_reported_as_the_public_call_and_its_composite_aten_op(tmp_path, capsys):
    script = SCRIPTS / "onehot.py"
    code, report = record(tmp_path, capsys, str(script))
    assert code == ExitCode.OK
    assert report["op"] == "aten::one_hot"  # CompositeImplicitAutograd: no dispatched op raised
    assert report["notes"] == [
        "no dispatched op raised: aten::one_hot is CompositeImplicitAutograd (it runs as other "
        "ops), so torch.nn.functional.one_hot's own check raised"
    ]
    assert report["public_call"] == "torch.nn.functional.one_hot"
    assert report["signature"]["op"] == "torch.nn.functional.one_hot"
    assert report["step"] == 2
    assert report["source"]["line"] == line_of(script, "F.one_hot(")
    assert any("class value max 4 ≥ 4 classes at [5]" in fact for fact in report["facts"])


def test_gather_under_no_grad_with_dataloader_workers(tmp_path, capsys):
    script = SCRIPTS / "gather_nograd.py"
    code, report = record(tmp_path, capsys, str(script))
    assert code == ExitCode.OK
    assert report["op"] == "aten::gather"
    assert report["source"]["line"] == line_of(script, "out.gather(1, p)")
    assert report["step"] == 2  # no optimizer: the third top-level forward
    assert any("index max 5 ≥ 5" in fact for fact in report["facts"])


def test_bce_inside_autocast(tmp_path, capsys):
    script = SCRIPTS / "autocast_bce.py"
    code, report = record(tmp_path, capsys, str(script))
    assert code == ExitCode.OK
    assert report["op"] == "aten::binary_cross_entropy"
    assert report["step"] == 3
    assert any("outside [0, 1]" in fact for fact in report["facts"])


def test_script_that_passes_is_nothing_to_reproduce(tmp_path, capsys):
    code, report = record(tmp_path, capsys, str(SCRIPTS / "passes.py"), "--flag", "x")
    assert code == ExitCode.NOT_REPRODUCED
    assert "nothing to reproduce" in report["_stderr"]
    assert report["status"] == "script-did-not-fail"
    assert report["exit_code"] == ExitCode.NOT_REPRODUCED


def test_script_args_and_main_are_passed_through(tmp_path):
    import subprocess

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocut",
            "record",
            "--root",
            str(tmp_path / "r"),
            str(SCRIPTS / "passes.py"),
            "--flag",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "argv ['--flag', 'x'] __main__" in done.stdout
    assert done.returncode == ExitCode.NOT_REPRODUCED


def test_plain_python_error_is_a_script_error_with_location(tmp_path, capsys):
    script = SCRIPTS / "plain_error.py"
    code, report = record(tmp_path, capsys, str(script))
    assert code == ExitCode.SCRIPT_ERROR
    assert report["status"] == "script-error"
    assert report["error"]["type"] == "KeyError"
    assert report["source"]["line"] == line_of(script, 'config["momentum"]')


def test_a_compiled_extensions_frame_is_never_taken_for_the_users_line(tmp_path, capsys):
    """CuPy's cuBLAS bindings raise from Cython frames named like `cupy_backends/.../cublas.pyx`
    (relative, not under site-packages): on the H200 one was reported as the user's line."""
    script = SCRIPTS / "cython_frame.py"
    code, report = record(tmp_path, capsys, str(script))
    assert code == ExitCode.OK
    assert report["status"] == "outside-dispatcher"
    assert report["source"]["file"] == str(script.resolve())
    assert report["source"]["line"] == line_of(script, "reprocut: culprit")
    assert report["surfaced_at"]["line"] == report["source"]["line"]


def test_sys_exit_code_is_reported(tmp_path, capsys):
    code, report = record(tmp_path, capsys, str(SCRIPTS / "exits.py"))
    assert code == ExitCode.SCRIPT_ERROR
    assert "exited with code 3" in report["error"]["message"]


def test_missing_script(tmp_path, capsys):
    assert main(["record", str(tmp_path / "nope.py")]) == ExitCode.USAGE_ERROR
    assert "no such script" in capsys.readouterr().err


def test_syntax_error(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfor x in :\n    pass\n")
    assert main(["record", str(bad)]) == ExitCode.SCRIPT_ERROR
    assert "bad.py:2: syntax error" in capsys.readouterr().err


def test_hang_is_killed_at_timeout(tmp_path, capsys):
    code, report = record(tmp_path, capsys, "--timeout", "8", str(SCRIPTS / "hangs.py"))
    assert code == ExitCode.TIMEOUT
    assert "timeout" in report["_stderr"]


def test_abort_leaves_trace_of_completed_steps(tmp_path, capsys):
    code, report = record(tmp_path, capsys, str(SCRIPTS / "aborts.py"))
    assert code == ExitCode.NOT_LOCALIZED
    assert report["status"] == "not-localized"
    assert "signal 6" in report["error"]["message"]
    run_dir = RunDir(Path(report["run_dir"]))
    steps = [r["step"] for r in run_dir.read_trace() if r["type"] == "step"]
    assert steps == [0, 1, 2]


def test_report_never_prints_environment_secrets(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MY_API_TOKEN", "s3cr3t-value-123")
    code = main(["record", "--root", str(tmp_path / "rec"), str(SCRIPTS / "ce_target.py")])
    captured = capsys.readouterr()
    assert code == ExitCode.OK
    assert "s3cr3t-value-123" not in captured.out + captured.err
    run = next((tmp_path / "rec" / "runs").iterdir())
    for path in run.iterdir():
        if path.suffix in (".json", ".jsonl", ".txt"):
            assert "s3cr3t-value-123" not in path.read_text()


def test_torch_compile_runs_eagerly_and_says_so(tmp_path, capsys):
    code, report = record(tmp_path, capsys, str(SCRIPTS / "compiled.py"))
    assert code == ExitCode.OK
    assert report["op"] == "aten::embedding"
    assert report["step"] == 2
    # the compiled run (Inductor, as the script ran it) fails too: the compiler is not involved
    assert report["torch_compile"]["used"] and report["torch_compile"]["fails_eagerly"] is True


def test_a_location_keeps_the_text_the_child_gave(tmp_path):
    from reprocut.localize.failure import location as _location

    script = tmp_path / "train.py"
    script.write_text("x = 1\nloss = step(x)\n")
    read = _location({"file": str(script), "line": 2})
    assert read is not None and read.text == "loss = step(x)"
    marker = "(end of script: the fault surfaced when reprocut waited for the GPU)"
    given = _location({"file": str(script), "line": 2, "text": marker})
    assert given is not None and given.text == marker
