"""Signatures from real CUDA assertion texts (bug-patterns.md) and CPU messages."""

from __future__ import annotations

import pytest

from reprocut.model.case import Signature
from reprocut.model.signature import (
    assertion_kind,
    classify,
    cuda_error_code,
    device_in_words,
    is_cuda_failure,
    is_memory_error,
    normalize_message,
    number_pattern,
    parse_assertions,
    same_numbers,
)

CUDA_MESSAGE = (
    "CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call"
)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: "
            "block: [67,0,0], thread: [0,0,0] Assertion `ind >=0 && ind < ind_dim_size && "
            '"vectorized gather kernel index out of bounds"` failed.',
            "index out of bounds",
        ),
        (
            "aten/src/ATen/native/cuda/Indexing.cu:1515: indexSelectSmallIndex: block: [0,0,0], "
            "thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
            "index out of bounds",
        ),
        (
            "aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
            "block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.",
            "target out of bounds",
        ),
        (
            "aten/src/ATen/native/cuda/Loss.cu:90: operator(): block: [0,0,0], thread: [7,0,0] "
            "Assertion `input_val >= zero && input_val <= one` failed.",
            "input outside [0, 1]",
        ),
        (
            "aten/src/ATen/native/cuda/TensorCompare.cu:109: _assert_async_cuda_kernel: block: "
            "[0,0,0], thread: [0,0,0] Assertion `probability tensor contains either `inf`, `nan` "
            "or element < 0` failed.",
            "invalid probability distribution",
        ),
        (
            "aten/src/ATen/native/cuda/TensorCompare.cu:109: _assert_async_cuda_kernel: block: "
            "[0,0,0], thread: [0,0,0] Assertion `` failed.",
            "empty assertion",
        ),
        (
            "aten/src/ATen/native/cuda/MaxUnpooling.cu:47: max_unpooling2d_forward_kernel: block: "
            "[0,0,0], thread: [3,0,0] Assertion `maxind >= 0 && maxind < outputImageSize` failed.",
            "max index out of range",
        ),
    ],
)
def test_kernel_assertions_fold_into_kinds(line, kind):
    [assertion] = parse_assertions(f"noise\n{line}\n{line}\n")
    assert assertion_kind(assertion.condition) == kind
    signature = classify("AcceleratorError", CUDA_MESSAGE, line, "aten::x")
    assert signature == Signature("AcceleratorError", 710, "aten::x", kind)


def test_two_kernels_of_one_lookup_give_one_signature():
    big = (
        "IndexKernelUtils.cu:16: vectorized_gather_kernel: block: [67,0,0], thread: [0,0,0] "
        'Assertion `ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of '
        'bounds"` failed.'
    )
    small = (
        "Indexing.cu:1515: indexSelectSmallIndex: block: [0,0,0], thread: [0,0,0] Assertion "
        "`srcIndex < srcSelectDimSize` failed."
    )
    a = classify("AcceleratorError", CUDA_MESSAGE, big, "aten::embedding")
    b = classify("RuntimeError", CUDA_MESSAGE, small, "aten::embedding")
    assert a.matches(b), "a different kernel chosen by shape is the same bug"


def test_triton_and_plain_illegal_address_share_a_code():
    assert cuda_error_code("Triton Error [CUDA]: an illegal memory access was encountered") == (
        700,
        "an illegal memory access was encountered",
    )
    assert cuda_error_code("CUDA error: misaligned address\nSearch for ...")[0] == 716


def test_cpu_messages_drop_numbers_but_keep_type():
    a = classify("IndexError", "Target 10 is out of bounds.")
    b = classify("IndexError", "Target 3 is out of bounds.")
    c = classify("RuntimeError", "Target 3 is out of bounds.")
    assert a == b
    assert not a.matches(c)


def test_a_negative_index_is_another_bug_than_one_past_the_end():
    """pointcloud_custom_backward's -1 (a missing neighbour) once shrank to an index of 1 into a
    one-row table: the same words, another bug."""
    message = "index {} is out of bounds for dimension 0 with size {}"
    missing = classify("IndexError", message.format(-1, 200))
    assert missing == classify("IndexError", message.format(-3, 1))
    assert not missing.matches(classify("IndexError", message.format(1, 1)))


def test_numbers_must_relate_as_they_did_an_empty_buffer_is_another_bug():
    """A numpy kernel's scatter into `np.zeros((count, d))` with an id equal to count had slid,
    reduced, to an `np.zeros(0)` output and to an id past a one-row buffer: the same kind,
    the numbers related otherwise."""
    original = "index 6 is out of bounds for axis 0 with size 6"
    assert number_pattern(original) == (1, 0, 1)
    assert same_numbers(original, "index 1 is out of bounds for axis 0 with size 1")
    assert not same_numbers(original, "index 0 is out of bounds for axis 0 with size 0")
    assert not same_numbers(original, "index 3 is out of bounds for axis 0 with size 0")
    assert not same_numbers(original, "index 6 is out of bounds for axis 0 with size 1")
    empty = "index 0 is out of bounds for axis 0 with size 0"  # the user's bug may be the empty one
    assert same_numbers(empty, empty) and not same_numbers(empty, original)
    assert same_numbers(original, "another message with 2 numbers: 0")  # another kind: not ours
    at = "bad pointer <built-in method x at 0x0> of size 32x0"
    assert same_numbers(at, at.replace("0x0", "0x7f").replace("32x0", "4x4"))  # not numbers


def test_op_mismatch_is_another_bug():
    a = Signature("IndexError", None, "aten::embedding", "index out of range in self")
    b = Signature("IndexError", None, "aten::index_select", "index out of range in self")
    assert not a.matches(b)
    assert a.matches(Signature("IndexError", None, None, "index out of range in self"))


def test_a_driver_error_without_a_code_here_is_still_a_cuda_failure():
    """CuPy's CUDA_ERROR_INVALID_ADDRESS_SPACE (the H200, a kernel handed host pointers) has no
    code in CUDA_ERRORS; it is asynchronous all the same, and on the GPU."""
    message = (
        "CUDA_ERROR_INVALID_ADDRESS_SPACE: operation not supported on global/shared address space"
    )
    assert cuda_error_code(message)[0] is None
    assert is_cuda_failure("CUDADriverError", message)
    assert is_cuda_failure("CUDARuntimeError", "cudaErrorSomethingNew: a new failure")
    assert device_in_words("CUDADriverError", message) == "cuda"
    assert not is_cuda_failure("ValueError", "CUDA_ERROR_ is a prefix of driver error names")
    assert not is_cuda_failure("IndexError", "index out of range in self")


def test_cupy_driver_and_runtime_errors_have_codes():
    assert (
        cuda_error_code("CUDADriverError: CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address")[0]
        == 716
    )
    assert (
        cuda_error_code(
            "CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered"
        )[0]
        == 700
    )


def test_a_bare_cuda_error_name_from_thrust_is_the_same_illegal_address() -> None:
    """Without blocking launches the sparse fault surfaced as thrust's message (H200)."""
    from reprocut.model.signature import classify

    bare = classify("RuntimeError", "transform: failed to synchronize: cudaErrorIllegalAddress")
    blocking = classify("AcceleratorError", "CUDA error: an illegal memory access was encountered")
    assert bare.error_code == 700 and bare.matches(blocking, compare_op=False)


def test_memory_errors_are_told_from_asserts() -> None:
    assert is_memory_error(Signature("AcceleratorError", 700, None, "x"))
    assert is_memory_error(Signature("RuntimeError", 716, None, "misaligned address"))
    assert not is_memory_error(Signature("AcceleratorError", 710, "aten::embedding", "index"))
    assert not is_memory_error(Signature("IndexError", None, "aten::embedding", "index out"))


def test_an_object_address_in_a_message_is_not_part_of_the_signature():
    """Seen on the H200: a backward that failed in a CUDA worker thread surfaced as
    "<built-in method run_backward of ... at 0x7fbe3fb8c850> returned NULL ...": the address
    differs every run, so two runs of the same failure would not match."""
    first = "<built-in method run_backward of torch._C._EngineBase object at 0x7fbe3fb8c850>"
    second = first.replace("0x7fbe3fb8c850", "0x7f0011223344")
    assert normalize_message(first) == normalize_message(second)
    assert "<address>" in normalize_message(first)
