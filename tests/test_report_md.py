"""report.md for a custom kernel's fault: the kernel by name, and what was wrong with its input."""

from __future__ import annotations

from reprocut.model.case import Signature, SourceLocation, TensorSpec
from reprocut.model.recording import ErrorInfo, Failure, TensorReport
from reprocut.report.diagnosis import layout_facts
from reprocut.report.markdown import ReportInputs, render, summary_line
from reprocut.shrink.header import Environment

OFFSET_VIEW = TensorSpec((572,), None, 1170, "float32", "cuda")
FAILURE = Failure(
    status="outside-dispatcher",
    error=ErrorInfo("CUDADriverError", "CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address", 716),
    signature=Signature("RuntimeError", 716, None, "misaligned address"),
    kernel="cmvn_vec4",
    step=4,
    source=SourceLocation("kernels.py", 39, "_KERNEL((blocks,), (threads,), args)"),
    tensors=(TensorReport("x", OFFSET_VIEW, layout_facts(OFFSET_VIEW)),),
    device="cuda",
)


def test_a_custom_kernel_fault_is_reported_by_the_kernels_name_and_its_inputs_layout():
    assert summary_line(FAILURE).startswith("`cmvn_vec4` raises CUDA error 716")
    text = render(
        ReportInputs(
            code="import torch\n",
            failure=FAILURE,
            environment=Environment(torch="2.11.0", cuda="13.0", python="3.12", os="Linux"),
            statements=5,
            tensor_elements=None,
            checks=80,
            seconds=60.0,
            verified_runs=3,
            verified_reproduced=3,
            cpu_reproduces=None,
        )
    )
    assert "- kernel (not a PyTorch op): `cmvn_vec4`" in text
    assert "- `x`: storage offset 1170 (4680 bytes: not 16-byte aligned)" in text
    assert "- `kernels.py:39`: `_KERNEL((blocks,), (threads,), args)`" in text


def test_a_custom_ops_fault_names_the_line_inside_its_implementation_then_its_caller():
    from dataclasses import replace

    failure = replace(
        FAILURE,
        status="culprit",
        kernel=None,
        op="seglib::segment_sum",
        launch=SourceLocation("ops.py", 28, "_segment_kernel[grid](x, ids, out)"),
        source=SourceLocation("train.py", 51, "pooled = segment_sum(x, ids)"),
    )
    text = render(
        ReportInputs(
            code="import torch\n",
            failure=failure,
            environment=Environment(torch="2.11.0", cuda="13.0", python="3.12", os="Linux"),
            statements=5,
            tensor_elements=None,
            checks=80,
            seconds=60.0,
            verified_runs=3,
            verified_reproduced=3,
            cpu_reproduces=None,
        )
    )
    inside = "- `ops.py:28`: `_segment_kernel[grid](x, ids, out)` (inside `seglib::segment_sum`)"
    called = "- called from `train.py:51`: `pooled = segment_sum(x, ids)`"
    assert inside in text and called in text
    assert text.index(inside) < text.index(called)
