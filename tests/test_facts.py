"""Every fact true (issue 34), the report's side: each fact is stated from evidence that
supports it and bears on the failure's class.

Real tensors and real torch messages for the rules; real `reprocut record` and `shrink` runs
of the scripts in tests/scripts for what the panel, report.md, repro.py and `--json` say.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reprocut.cli import main
from reprocut.model.case import ArgList, ReproCase, Signature, TensorSpec
from reprocut.model.errors import ExitCode
from reprocut.model.publicapi import composite_op
from reprocut.model.recording import ErrorInfo, Failure, RunDir, TensorReport
from reprocut.model.signature import last_exception
from reprocut.report.diagnosis import explain
from reprocut.report.display.failure import panel_text
from reprocut.report.markdown import ReportInputs, expected_error, render
from reprocut.shrink.emitter import emit
from reprocut.shrink.header import Environment, Header, original_args, restate_message

SCRIPTS = Path(__file__).parent / "scripts"
LINEAR = "torch.nn.functional.linear"


def record(tmp_path: Path, capsys: pytest.CaptureFixture[str], script: str, *args: str) -> dict:
    code = main(
        ["record", "--json", "--quiet", "--root", str(tmp_path / "rec"), str(SCRIPTS / script),
         *args]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK, report
    return report


def shrink(run_dir: str, capsys: pytest.CaptureFixture[str]) -> dict:
    code = main(["shrink", "--json", run_dir])
    result = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK and result["status"] == "verified", result
    return result


def message_of(call) -> str:
    with pytest.raises((RuntimeError, IndexError)) as raised:
        call()
    return str(raised.value)


# --- a composite op's name -------------------------------------------------------------------


def test_a_composite_public_call_is_named_by_the_aten_op_it_binds() -> None:
    assert composite_op("torch.nn.functional.one_hot") == "aten::one_hot"
    assert composite_op("torch.nn.functional.embedding") is None  # a Python function
    assert composite_op("torch.Tensor.__getitem__") is None  # no aten op of that name
    assert composite_op("torch.Tensor.view") is None  # an aten op, but not composite
    assert composite_op(None) is None


# --- relevant facts only ---------------------------------------------------------------------


def test_a_linear_layer_fed_an_unflattened_batch_gets_the_dimension_that_disagrees() -> None:
    images, weight, bias = torch.randn(64, 1, 28, 28), torch.randn(256, 784), torch.randn(256)
    message = message_of(lambda: F.linear(images, weight, bias))
    assert message == "mat1 and mat2 shapes cannot be multiplied (1792x28 and 784x256)"
    # what the dispatch mode saw: addmm of the reshaped input and the transposed weight
    aten = explain("aten::addmm", LINEAR, [bias, images.reshape(1792, 28), weight.t()], {}, message)
    assert aten.family == "shape"
    assert aten.facts == {
        1: ("28 columns (dim 1) ≠ the 784 rows of the next argument (784, 256)",),
        2: ("784 rows (dim 0) ≠ the 28 columns of the previous argument (1792, 28)",),
    }  # and never "not contiguous: stride (1, 784)": F.linear always transposes its weight
    public = explain(None, LINEAR, [images, weight, bias], {}, message)
    assert public.facts == {
        0: ("last dim 28 of (64, 1, 28, 28) ≠ the 784 in_features of the weight (256, 784)",)
    }
    assert public.diagnosis == (
        "The linear layer's input (64, 1, 28, 28) ends in 28 features, but its weight "
        "(256, 784) takes 784 (in_features). Flattened from dim 1 (1 × 28 × 28 = 784) it "
        "would fit: the input was not flattened before the layer (`x.flatten(1)`)."
    )


def test_broadcasting_and_view_mismatches_name_the_dimension_and_the_count() -> None:
    a, b = torch.zeros(8, 3), torch.zeros(8, 4)
    found = explain("aten::add", None, [a, b], {}, message_of(lambda: a + b))
    assert found.facts == {
        0: ("dim 1 of (8, 3) is 3, dim 1 of (8, 4) is 4: neither is 1, so they do not broadcast",)
    }
    t = torch.zeros(2, 3, 4)
    found = explain("aten::view", None, [t, [5, 4]], {}, message_of(lambda: t.view(5, 4)))
    assert found.facts == {0: ("(2, 3, 4) holds 24 elements; shape [5, 4] needs 20",)}


def test_layout_facts_only_where_strides_can_explain_the_failure() -> None:
    source, index = torch.arange(12).reshape(3, 4).t(), torch.tensor([0, 20])
    message = message_of(lambda: torch.take(source, index))  # a range check: strides irrelevant
    assert explain("aten::take", None, [source, index], {}, message).facts == {
        0: ("values in [0, 11]",),
        1: ("values in [0, 20]",),
    }
    misaligned = "CUDA error: misaligned address"  # a kernel walking memory: they bear on it
    assert explain("aten::take", None, [source, index], {}, misaligned).facts[0] == (
        "values in [0, 11]",
        "not contiguous: stride (1, 4) for shape (4, 3)",
    )


def test_record_of_the_unflattened_batch_shows_the_shape_diagnosis_and_no_layout_fact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = record(tmp_path, capsys, "linear_unflattened.py")
    assert (report["op"], report["public_call"]) == ("aten::addmm", LINEAR)
    assert report["facts"] == [
        "28 columns (dim 1) ≠ the 784 rows of the next argument (784, 256)",
        "784 rows (dim 0) ≠ the 28 columns of the previous argument (1792, 28)",
    ]
    assert report["diagnosis"].startswith("The linear layer's input (64, 1, 28, 28) ends in 28")
    run = RunDir(Path(report["run_dir"]))
    panel = panel_text(run.read_failure(), run.path)
    assert "contiguous" not in panel.replace("│ contiguous │", "")  # the table's column aside
    assert "mat2: 784 rows (dim 0) ≠ the 28 columns of the previous argument" in panel


# --- the repro's own message, and the original's sizes ---------------------------------------


def test_restating_the_message_changes_only_the_message_lines() -> None:
    case = ReproCase(
        target=LINEAR,
        args=(TensorSpec((1, 1, 1, 1)), TensorSpec((1, 2))),
        expected=Signature("RuntimeError", None, "aten::addmm", "mat1 and mat2 shapes ..."),
    )
    original = "mat1 and mat2 shapes cannot be multiplied (1792x28 and 784x256)"
    code = emit(case, Header(expected=case.expected, message=original)).code
    own = "mat1 and mat2 shapes cannot be multiplied (1x1 and 2x1)"
    restated = restate_message(code, own, original)
    assert (
        restated.replace(
            f"Message: {own}\nOriginal's message (the unshrunk program): {original}\n",
            f"Message: {original}\n",
        )
        == code
    )
    assert restate_message(restated, own, original) == restated  # said once, however often
    assert restate_message(code, original, original) == code  # the same message: as it was
    compile(restated, "repro.py", "exec")


def test_report_md_quotes_the_repros_error_with_the_originals_labelled() -> None:
    original = "mat1 and mat2 shapes cannot be multiplied (1792x28 and 784x256)"
    signature = Signature("RuntimeError", None, "aten::addmm", "mat1 and mat2 shapes ...")
    failure = Failure("localized", ErrorInfo("RuntimeError", original), signature)
    lines = expected_error(failure, "mat1 and mat2 shapes cannot be multiplied (1x1 and 2x1)")
    assert "\n".join(lines) == (
        "## Expected error\n\n"
        "```\nRuntimeError: mat1 and mat2 shapes cannot be multiplied (1x1 and 2x1)\n```\n\n"
        "The original program's error (before shrinking):\n\n"
        "```\nRuntimeError: mat1 and mat2 shapes cannot be multiplied (1792x28 and 784x256)\n```"
    )
    same = expected_error(failure, failure.error.message)
    assert same == [
        "## Expected error",
        "",
        "```\nRuntimeError: " + failure.error.message + "\n```",
    ]


def test_a_replayed_device_assert_is_the_error_and_a_cublas_failure_what_was_seen(tmp_path) -> None:
    # on the H100 the BERT trainer's nll_loss device assert reached the script as the next
    # matmul's cuBLAS failure; the snapshot replay raised the op's own error
    from reprocut.localize.culprit import _merge_replay

    seen = {"type": "RuntimeError", "code": None, "message": "CUDA error: "
            "CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`"}  # fmt: skip
    own = {"type": "AcceleratorError", "code": 710,
           "message": "CUDA error: device-side assert triggered"}  # fmt: skip
    assertion = ("/pytorch/aten/src/ATen/native/cuda/Loss.cu:242: nll_loss_forward_reduce_cuda_"
                 "kernel_2d: block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < "
                 "n_classes` failed.\n")  # fmt: skip
    error = _merge_replay(seen, "", assertion, own)
    assert (error.type, error.code, error.message) == (own["type"], 710, own["message"])
    assert error.surfaced_as == {"type": "RuntimeError", "message": seen["message"]}
    assert error.assertions and error.assertions[0]["condition"] == "t >= 0 && t < n_classes"
    # the same error as the replay's: the run's, with nothing surfaced otherwise
    same = _merge_replay(own, assertion, "", own)
    assert same.surfaced_as is None and same.code == 710
    failure = Failure("localized", error, Signature("AcceleratorError", 710, "aten::nll_loss_forward",
                                                    "t >= 0 && t < n_classes"))  # fmt: skip
    assert "seen as  RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED" in panel_text(
        failure, tmp_path
    )
    text = "\n".join(expected_error(failure, own["message"]))
    assert "raised instead" in text and "CUBLAS_STATUS_EXECUTION_FAILED" in text


def test_the_originals_tensors_are_matched_to_the_facts_by_shape_and_dtype() -> None:
    ids, weight = TensorSpec((1, 120), dtype="int64"), TensorSpec((100, 256))
    public = ReproCase(target="torch.nn.functional.embedding", args=(ids, weight))
    table = (  # the aten call's table: weight first
        TensorReport("weight", weight, ()),
        TensorReport("indices", ids, ("index max 119 ≥ 100 rows at [0, 94]",
                                      "20 of 120 index values outside [0, 100)")),
    )  # fmt: skip
    found = original_args(public, table)
    assert [(a.path, a.shape, a.facts) for a in found] == [
        (("args", 0), (1, 120), table[1].facts),
        (("args", 1), (100, 256), ()),
    ]


def test_the_originals_list_items_are_named_as_the_repro_names_them() -> None:
    """index_put_'s indices are a list: the offending one is stated by its own variable."""
    matrix, rows, cols = (
        TensorSpec((6, 6)),
        TensorSpec((32,), dtype="int64"),
        TensorSpec((32,), dtype="int64"),
    )
    values = TensorSpec((32,))
    table = (
        TensorReport("self", matrix, ()),
        TensorReport("indices[0]", rows, ("index max 6 ≥ 6 (size of dim 0) at [5]",)),
        TensorReport("indices[1]", cols, ("all 32 index values within [-6, 6)",)),
        TensorReport("values", values, ()),
    )
    original = ReproCase("torch.Tensor.index_put_", (matrix, ArgList((rows, cols)), values))
    small = ReproCase(
        "torch.Tensor.index_put_",
        (TensorSpec((1, 1)), ArgList((TensorSpec((1,), dtype="int64"),) * 2), TensorSpec((1,))),
    )
    header = emit(small, Header(original=original_args(original, table))).code.split('"""')[1]
    assert "Original: x (6, 6), indices0 (32,), indices1 (32,), values (32,)\n" in header
    assert "\n  indices0: index max 6 ≥ 6 (size of dim 0) at [5]\n" in header
    assert "indices1:" not in header  # "all within" explains nothing


def test_a_shrunk_shape_mismatch_quotes_its_own_message_and_the_originals_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = record(tmp_path, capsys, "linear_unflattened.py")
    result = shrink(report["run_dir"], capsys)
    repro = Path(result["repro"])
    plain = subprocess.run([sys.executable, repro.name], cwd=repro.parent, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    printed = last_exception(plain.stderr)
    assert printed is not None and printed[0] == "RuntimeError"
    assert printed[1] != report["error"]["message"]  # the shrink made the numbers smaller
    header = repro.read_text().split('"""')[1].splitlines()
    original = report["error"]["message"]
    assert f"Message: {printed[1]}" in header
    assert f"Original's message (the unshrunk program): {original}" in header
    assert "Original: x (64, 1, 28, 28), weight (256, 784), bias (256,)" in header
    markdown = Path(result["report"]).read_text()
    assert f"```\nRuntimeError: {printed[1]}\n```" in markdown
    assert (
        f"The original program's error (before shrinking):\n\n```\nRuntimeError: {original}\n```"
        in markdown
    )


def test_a_shrunk_index_repro_states_the_original_table_and_the_offending_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = record(tmp_path, capsys, "position_table.py")
    assert report["facts"][0] == "index max 119 ≥ 100 rows at [0, 119]"
    result = shrink(report["run_dir"], capsys)
    code = Path(result["repro"]).read_text()
    header = code.split('"""')[1].splitlines()
    assert "Original: ids (1, 120), weight (100, 256)" in header
    assert (
        "  ids: index max 119 ≥ 100 rows at [0, 119]; 20 of 120 index values outside [0, 100)"
        in header
    )
    assert "ids = torch.tensor([100])" in code  # minimal, as it should be (one dimension)


# --- failures after the training loop ---------------------------------------------------------


def test_a_failure_after_the_training_loop_names_no_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = record(tmp_path, capsys, "generate_after_loop.py")
    assert report["op"] == "aten::embedding"
    assert report["step"] is None
    assert report["after_loop"] == {
        "steps": 30,
        "function": "generate",
        "text": "after the training loop (30 steps ran), in generate()",
    }
    run = RunDir(Path(report["run_dir"]))
    failure = run.read_failure()
    panel = panel_text(failure, run.path)
    assert "│ when     after the training loop (30 steps ran), in generate()" in panel
    assert "step " not in panel
    markdown = render(ReportInputs("", failure, Environment(), 1, 1, 0, 0.0, 1, 1, True))
    assert "- when: `after the training loop (30 steps ran), in generate()`" in markdown
    assert "training step" not in markdown


def test_a_failure_fetching_the_next_batch_is_in_the_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = record(tmp_path, capsys, "batch_in_loop_header.py")
    assert report["step"] == 3 and report["after_loop"] is None


@pytest.mark.cuda
def test_a_device_assert_after_the_training_loop_names_no_step_on_the_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the GPU the lookup asserts asynchronously: the culprit comes from a snapshot or a
    rerun, which read where their op ran, not where the error surfaced."""
    report = record(tmp_path, capsys, "generate_after_loop.py", "cuda")
    assert report["op"] == "aten::embedding" and report["step"] is None
    assert report["after_loop"] == {
        "steps": 30,
        "function": "generate",
        "text": "after the training loop (30 steps ran), in generate()",
    }
