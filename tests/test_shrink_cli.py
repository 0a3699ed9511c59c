"""`reprocut shrink` end to end on hand-made recordings: repro.py is small, standalone, verified."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reprocut.check.oracle import Oracle, OtherFailure
from reprocut.check.verify import signature_from_stderr
from reprocut.cli import main
from reprocut.model.case import (
    Captured,
    Generated,
    Literal,
    ReproCase,
    Signature,
    SourceLocation,
    TensorSpec,
)
from reprocut.model.errors import ExitCode
from reprocut.model.recording import ErrorInfo, Failure, RunDir
from reprocut.shrink.emitter import count_statements

EMBEDDING = Signature("IndexError", None, "aten::embedding", "index out of range in self")


def make_run_dir(
    root: Path,
    case: ReproCase,
    signature: Signature,
    inputs: dict[str, torch.Tensor],
    *,
    message: str = "",
    device: str = "cpu",
) -> RunDir:
    run = RunDir.create(root / ".reprocut", "case")
    if inputs:
        torch.save(inputs, run.inputs_path)
    failure = Failure(
        status="localized",
        error=ErrorInfo(signature.error_type, message or signature.kind, code=signature.error_code),
        signature=signature,
        op=signature.op,
        public_call=case.target,
        step=3,
        phase="forward",
        module="model.embed",
        source=SourceLocation("train.py", 12, "x = self.embed(ids)"),
        cases=(case,),
        script="train.py",
        cwd=str(root),
        device=device,
    )
    run.write_failure(failure)
    return run


def embedding_recording(root: Path) -> RunDir:
    ids = torch.randint(0, 50, (4, 16))
    ids[2, 5] = 1000
    case = ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((4, 16), dtype="int64", values=Captured("ids")),
            TensorSpec((50, 32), requires_grad=True, values=Generated("randn")),
        ),
        kwargs=(("padding_idx", 0),),
        expected=EMBEDDING,
        aten_op="aten::embedding",
        inputs_file="inputs.pt",
    )
    return make_run_dir(root, case, EMBEDDING, {"ids": ids})


def run_shrink(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["shrink", *args, "--json", "--timeout", "60"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else {}


def run_standalone(repro: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Copy repro.py alone into an empty directory and run it with plain python."""
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(repro, empty / "repro.py")
    return subprocess.run(
        [sys.executable, "repro.py"], cwd=empty, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_embedding_recording_shrinks_to_a_small_standalone_repro(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = embedding_recording(tmp_path)
    code, result = run_shrink([str(run.path)], capsys)
    assert code == ExitCode.OK
    assert result["status"] == "verified"
    assert result["verified"] == {"runs": 3, "reproduced": 3}
    assert result["statements"] <= 6
    assert result["tensor_elements"] <= 64
    assert result["signature"]["kind"] == "index out of range in self"
    assert result["cpu_reproduces"] is True
    repro = Path(result["repro"])
    text = repro.read_text()
    assert count_statements(text) == result["statements"]
    assert "torch.tensor([1000])" in text  # the offending id is kept, as one dimension
    assert (run.path / "report.md").exists()
    assert "index out of range in self" in (run.path / "report.md").read_text()
    done = run_standalone(repro, tmp_path)
    signature = signature_from_stderr(done.stderr)
    assert signature is not None and signature.matches(EMBEDDING, compare_op=False), done.stderr


@pytest.mark.slow
def test_out_dir_and_latest_recording_and_no_fork(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    embedding_recording(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    code, result = run_shrink(
        ["--out", str(out), "--no-fork", "--max-checks", "5", "--runs", "1"], capsys
    )
    assert code == ExitCode.OK, result
    assert Path(result["repro"]) == (out / "repro.py").resolve()
    assert (out / "report.md").exists()
    assert result["checks"] <= 5 + 2  # the initial check and the CPU check come on top


def test_missing_run_dir_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["shrink", str(tmp_path / "nope")]) == ExitCode.USAGE_ERROR
    assert "no-recording" in capsys.readouterr().err


def test_corrupt_recording_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = RunDir.create(tmp_path / ".reprocut", "bad")
    run.failure_path.write_text("{not json")
    assert main(["shrink", str(run.path)]) == ExitCode.USAGE_ERROR
    assert "corrupt-recording" in capsys.readouterr().err


def test_a_case_that_does_not_reproduce_keeps_the_unshrunk_repro(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((2,), dtype="int64", values=Literal((1, 2))),
            TensorSpec((10, 3), values=Generated("zeros")),
        ),
        expected=EMBEDDING,
    )
    run = make_run_dir(tmp_path, case, EMBEDDING, {})
    code, result = run_shrink([str(run.path), "--runs", "1"], capsys)
    assert code == ExitCode.NOT_REPRODUCED
    assert result["status"] == "not-reproduced"
    assert "torch.tensor([1, 2])" in (run.path / "repro.py").read_text()
    assert "--source" in (run.path / "report.md").read_text()


# --- device-side assert families on a GPU (hand-made recordings on cuda) -------------------------


def _cuda_families() -> list[tuple[str, ReproCase, dict[str, torch.Tensor], str]]:
    ids = torch.randint(0, 50, (8, 32))
    ids[3, 7] = 1000
    target = torch.randint(0, 5, (64,))
    target[17] = 7
    index = torch.randint(0, 3, (16, 3))
    index[9, 1] = 5
    labels = torch.randint(0, 10, (128,))
    labels[100] = 255
    probs = torch.softmax(torch.randn(4, 100), dim=-1)
    probs[2, 40] = float("nan")
    bce = torch.rand(32)
    bce[20] = 1.5
    cuda = "cuda"

    def tensor(shape: tuple[int, ...], key: str, dtype: str = "int64") -> TensorSpec:
        return TensorSpec(shape, dtype=dtype, device=cuda, values=Captured(key))

    def noise(*shape: int) -> TensorSpec:
        return TensorSpec(shape, device=cuda, values=Generated("randn"))

    return [
        ("embedding", ReproCase("torch.nn.functional.embedding", (tensor((8, 32), "ids"), noise(50, 16))), {"ids": ids}, "index out of bounds"),
        ("cross_entropy", ReproCase("torch.nn.functional.cross_entropy", (noise(64, 5), tensor((64,), "target"))), {"target": target}, "target out of bounds"),
        ("gather", ReproCase("torch.gather", (noise(16, 3), 1, tensor((16, 3), "index"))), {"index": index}, "index out of bounds"),
        ("scatter_add", ReproCase("torch.Tensor.scatter_add_", (noise(16, 3), 1, tensor((16, 3), "index"), noise(16, 3))), {"index": index}, "index out of bounds"),
        ("one_hot", ReproCase("torch.nn.functional.one_hot", (tensor((128,), "labels"), 10)), {"labels": labels}, "index out of bounds"),
        ("multinomial", ReproCase("torch.multinomial", (tensor((4, 100), "probs", "float32"), 1)), {"probs": probs}, "invalid probability distribution"),
        ("bce", ReproCase("torch.nn.functional.binary_cross_entropy", (tensor((32,), "bce", "float32"), TensorSpec((32,), device=cuda, values=Generated("rand")))), {"bce": bce}, "input outside [0, 1]"),
    ]  # fmt: skip


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("family", _cuda_families(), ids=lambda family: family[0])
def test_cuda_device_assert_family_shrinks_and_verifies(
    family: tuple[str, ReproCase, dict[str, torch.Tensor], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, case, inputs, kind = family
    with Oracle(timeout=120) as oracle:  # what the recording would have seen
        seen = oracle.check_case(case, inputs)
    assert isinstance(seen, OtherFailure), seen
    signature = seen.signature
    assert signature.error_code == 710 and signature.kind == kind, signature
    from dataclasses import replace

    run = make_run_dir(
        tmp_path, replace(case, expected=signature), signature, inputs, device="cuda"
    )
    code, result = run_shrink([str(run.path), "--max-time", "120"], capsys)
    assert code == ExitCode.OK, result
    assert result["statements"] <= 6
    assert result["tensor_elements"] <= 64
    done = run_standalone(Path(result["repro"]), tmp_path)
    found = signature_from_stderr(done.stderr)
    assert found is not None and found.matches(signature, compare_op=False), done.stderr


# --- record -> shrink -> python repro.py on realistic scripts (corpus/) ---------------------------

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
END_TO_END = ("lm_grown_vocab", "rl_dqn_gather", "llm_sampling_nan")


@pytest.mark.slow
@pytest.mark.parametrize("name", END_TO_END)
def test_record_then_shrink_gives_a_small_standalone_repro(name: str, tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib")
    expected = tomllib.loads((CORPUS / name / "case.toml").read_text())["expected"]["cpu"]
    work = tmp_path / name
    shutil.copytree(CORPUS / name, work, ignore=shutil.ignore_patterns("__pycache__"))
    record = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--json", "train.py"],
        cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert json.loads(record.stdout)["status"] == "localized", record.stderr[-2000:]
    shrink = subprocess.run(
        [sys.executable, "-m", "reprocut", "shrink", "--json", "--max-time", "120"],
        cwd=work, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert shrink.returncode == ExitCode.OK, shrink.stderr[-2000:]
    result = json.loads(shrink.stdout)
    assert result["status"] == "verified"
    assert result["statements"] <= 6
    assert result["tensor_elements"] <= 64
    done = run_standalone(Path(result["repro"]), tmp_path)
    found = signature_from_stderr(done.stderr)
    assert found is not None, done.stderr
    assert (found.error_type, found.kind) == (expected["error_type"], expected["kind"])


def test_a_script_error_recording_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = RunDir.create(tmp_path / ".reprocut", "script-error")
    signature = Signature("ImportError", None, None, "No module named 'triton'")
    run.write_failure(
        Failure(
            status="script-error",
            error=ErrorInfo("ImportError", "No module named 'triton'"),
            signature=signature,
        )
    )
    assert main(["shrink", str(run.path)]) == ExitCode.SCRIPT_ERROR
    assert "script-error" in capsys.readouterr().err


@pytest.mark.slow
def test_source_reduction_of_a_stride_ignoring_extension_end_to_end(tmp_path, monkeypatch, capsys):
    """record names only the extension's line; shrink --source cuts the script to a few lines
    that still fail the same way when run as `python repro.py` from another folder."""
    case = Path(__file__).parent.parent / "benchmarks" / "source_cases" / "numpy_kernel"
    work = tmp_path / "project"
    shutil.copytree(case, work)
    monkeypatch.chdir(work)
    assert main(["record", "--quiet", "train.py"]) == ExitCode.SCRIPT_ERROR
    out = tmp_path / "out"
    capsys.readouterr()
    code = main(["shrink", "--source", "--json", "--out", str(out)])  # the defaults
    assert code == ExitCode.OK
    result = json.loads(capsys.readouterr().out)
    assert result["fixed_point"] is True and result["stopped"] == "fixed point"
    assert result["limits"]["max_time"] is None  # no clock: the safety cap only
    passes = result["passes"]  # which passes cut it, by count
    assert passes and all(count > 0 for count in passes.values())
    # the kernel is called from the model's `forward(self, x)`: the jump makes the call alone
    assert passes.get("jump_to_call", 0) + passes.get("jump_ahead", 0) == 1
    repro = (out / "repro.py").read_text()
    assert len([line for line in repro.splitlines() if line.strip()]) <= 12
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, str(out / "repro.py")],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "fused_bias_gelu: illegal memory access" in done.stderr


def test_the_note_says_which_limit_stopped_the_shrink_before_its_fixed_point() -> None:
    from reprocut.model.limits import TimeLimit
    from reprocut.pipeline.same_bug import stopped_note

    assert stopped_note("fixed point", TimeLimit.from_option(None), 2000) == ()
    (cap,) = stopped_note("safety cap", TimeLimit.from_option(None), 2000)
    assert "600 s safety cap (no --max-time was given)" in cap and "a larger --max-time" in cap
    (user,) = stopped_note("max time", TimeLimit.from_option(45), 2000)
    assert "45 s limit (--max-time), before its fixed point" in user
    (checks,) = stopped_note("max checks", TimeLimit.from_option(None), 80)
    assert "80-check limit (--max-checks)" in checks


@pytest.mark.slow
def test_the_check_log_has_a_line_per_check_pass_and_phase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv("REPROCUT_CHECK_LOG", str(log))
    run = embedding_recording(tmp_path)
    code, result = run_shrink([str(run.path), "--runs", "1"], capsys)
    assert code == ExitCode.OK, result
    events = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [event["kind"] for event in events]
    checks = [event for event in events if event["kind"] == "check"]
    assert len(checks) == result["checks"]
    assert all(event["seconds"] > 0 and event["verdict"] for event in checks)
    assert "Reproduced" in {event["verdict"] for event in checks}
    assert "pass" in kinds and "accepted" in kinds and kinds[-1] == "phase"
    phases = {event["phase"] for event in events if event["kind"] == "phase"}
    assert {"first_check", "shrink", "verify"} <= phases
    # benchmarks/check_log_summary.py: every check that ran lands in one row, passes by name
    from benchmarks.check_log_summary import OUTSIDE, markdown, read_events, summarize

    summary = summarize(read_events(log))
    total = summary.total()
    unstarted = [e for e in checks if e["verdict"] == "Cancelled" and e["child_seconds"] is None]
    assert total.runs == len(checks) - len(unstarted) and total.runs >= 2
    accepted = sum(event["kind"] == "accepted" for event in events)
    assert total.accepted == accepted and accepted >= 1
    assert set(summary.passes) - {OUTSIDE} == {
        event["pass_name"] for event in events if event["kind"] == "pass"
    }
    assert summary.passes[OUTSIDE].runs >= 1  # the first check, before any pass
    assert summary.phases["shrink"] > 0 and "| total |" in markdown("embedding", summary)
    # the command's start is logged by main(); its exit by the `reprocut` entry point only
    assert events[0]["kind"] == "command" and events[0]["at"] == "start"
    assert summary.outside is None and "outside them" not in markdown("embedding", summary)


def test_the_check_log_summary_says_what_lies_outside_the_phases() -> None:
    from benchmarks.check_log_summary import markdown, summarize

    events = [
        {"t": 100.0, "kind": "command", "at": "start"},
        {"t": 100.5, "kind": "phase", "phase": "read"},
        {"t": 101.0, "kind": "phase", "phase": "read", "seconds": 0.5},
        {"t": 104.0, "kind": "command", "at": "exit", "code": 0},
    ]
    summary = summarize(events)
    assert summary.outside == (0.5, 3.0)
    said = (
        "0.5 s from the command's start to its first phase, 3.0 s from its last phase to its exit"
    )
    assert said in markdown("case", summary)
