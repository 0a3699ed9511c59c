"""Turn an exception (plus the process's stderr) into a Signature.

CUDA puts the useful text (the kernel's assertion) on stderr, once per failing thread, not into
the exception; and the kernel that asserts depends on shapes. So the signature keeps the error code
and a normalized *kind* of assertion, never the kernel name or file:line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reprocut.model.case import Signature
from reprocut.model.compiled import normalize_inductor
from reprocut.model.oom import OOM_KIND, is_out_of_memory

# "CUDA error: device-side assert triggered" and friends, by CUDA runtime error code.
CUDA_ERRORS = {
    "device-side assert triggered": 710,
    "an illegal memory access was encountered": 700,
    "misaligned address": 716,
    "an illegal instruction was encountered": 715,
    "unspecified launch failure": 719,
    "invalid configuration argument": 9,
    "out of memory": 2,
    "invalid argument": 1,
    "too many resources requested for launch": 701,
    "operation not permitted when stream is capturing": 900,
}

_ASSERT_LINE = re.compile(
    r"^(?P<file>\S+?):(?P<line>\d+): (?P<function>.*?): block: \[(?P<block>[\d,]+)\], "
    r"thread: \[(?P<thread>[\d,]+)\] Assertion `(?P<condition>.*)` failed\.\s*$"
)

# Assertion conditions of kernels that check the same thing, folded into one kind.
# Order matters: the first pattern that matches names the kind.
_ASSERTION_KINDS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (
            r"probability tensor contains|cumdist\[size - 1\]|isinf\(val\)|ge\(val, zero\)",
            "invalid probability distribution",
        ),
        (r"t >= 0 && t < n_classes|cur_target >= 0|target.*n_classes", "target out of bounds"),
        (
            r"input_val >= zero && input_val <= one|input >= 0\. && input <= 1\.",
            "input outside [0, 1]",
        ),
        (r"maxind >= 0", "max index out of range"),
        (r"end >= begin", "offsets not increasing"),
        (r"input_idx < numRows", "index out of bounds"),
        (r"label >= 0 && label < num_labels", "target out of bounds"),
        (
            r"index out of bounds|srcIndex < srcSelectDimSize|dstIndex < dstAddDimSize|"
            r"ind_dim_size|idx_dim >= 0|index < sizes\[i\]|indexValue >= 0|indexAtDim",
            "index out of bounds",
        ),
        (r"^$", "empty assertion"),
    )
)

NUMBER = "<n>"  # a number, in a kind read from a message
_NUMBER = re.compile(r"(?<![A-Za-z_\d])-?\d+(\.\d+)?(e[-+]?\d+)?")
_SIZES = re.compile(r"\b\d+(?:x\d+)+\b")  # "32x32", "4x4x4"
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")  # "<built-in method ... at 0x7fbe3fb8c850>"
_CUDA_ERROR = re.compile(r"CUDA error: ([^\n]+)")
_TRITON_ERROR = re.compile(r"Triton Error \[CUDA\]: ([^\n]+)")
# CuPy and the driver API: "CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address",
# "cudaErrorIllegalAddress: an illegal memory access was encountered"
_DRIVER_ERROR = re.compile(r"(?:CUDA_ERROR_[A-Z_]+|cudaError[A-Za-z]+): ([^\n]+)")
# a bare error name, as thrust's "transform: failed to synchronize: cudaErrorIllegalAddress" has it
_ERROR_NAMES = {
    "cudaErrorIllegalAddress": "an illegal memory access was encountered",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "an illegal memory access was encountered",
    "cudaErrorMisalignedAddress": "misaligned address",
    "CUDA_ERROR_MISALIGNED_ADDRESS": "misaligned address",
    "cudaErrorAssert": "device-side assert triggered",
    "CUDA_ERROR_ASSERT": "device-side assert triggered",
    "cudaErrorLaunchFailure": "unspecified launch failure",
    "CUDA_ERROR_LAUNCH_FAILED": "unspecified launch failure",
}
_ERROR_NAME = re.compile(r"\b(" + "|".join(_ERROR_NAMES) + r")\b")
_CUBLAS = re.compile(r"(CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+)")


# A non-finite output (`record --nan`): the repro's own check raises it, so a plain run shows it
# as `FloatingPointError: non-finite output: nan` (or `inf`: NaN wins when both are there).
NONFINITE_ERROR = "FloatingPointError"
NONFINITE_MESSAGE = "non-finite output: {kind}"


def nonfinite_signature(op: str | None, kind: str) -> Signature:
    """The signature of an op whose output held NaN (`kind` "nan") or else inf ("inf")."""
    return Signature(NONFINITE_ERROR, None, op, NONFINITE_MESSAGE.format(kind=kind))


def is_nonfinite(signature: Signature | None) -> bool:
    return (
        signature is not None
        and signature.error_type == NONFINITE_ERROR
        and signature.kind.startswith(NONFINITE_MESSAGE.format(kind=""))
    )


MEMORY_ERRORS = {700, 715, 716, 719}  # illegal address, illegal instruction, misaligned, launch


def is_memory_error(signature: Signature) -> bool:
    """A fault memcheck can attribute: an illegal or misaligned access, not an assert."""
    kind = signature.kind.lower()
    return (
        signature.error_code in MEMORY_ERRORS
        or "illegal memory access" in kind
        or ("misaligned" in kind)
    )


# an illegal address's other face: the same bad pointer, landing in the host's window of the
# address space, raises this instead (CUDA_ERROR_INVALID_ADDRESS_SPACE)
ADDRESS_SPACE = "operation not supported on global/shared address space"


def landed_elsewhere(seen: Signature | None, expected: Signature) -> bool:
    """An illegal memory access expected, a candidate raised CUDA's invalid address space error:
    it faults too, and the error differs only by where its bad address fell. On the H200 the cut
    of cuda_cupy_host_pointers (a kernel given host pointers) to its failing call raised it in 4
    of its 6 plain runs over four calls, the illegal address in 2; refused, the reduction went
    back to the whole script (160-226 s instead of 62-69). On an H100, 15 of that case's checks
    raised it in one call and none in the call before. Counted as reproducing for a candidate
    only (its check, its plain run): repro.py's verification still wants the original's own
    error, and the same bug is memcheck's to say."""
    if seen is None or not is_memory_error(expected) or "misaligned" in expected.kind.lower():
        return False
    return ADDRESS_SPACE in seen.kind or "CUDA_ERROR_INVALID_ADDRESS_SPACE" in seen.kind


@dataclass(frozen=True, slots=True)
class AssertionLine:
    """One device-side assertion printed by a kernel thread."""

    file: str
    line: int
    function: str
    block: tuple[int, ...]
    thread: tuple[int, ...]
    condition: str

    @property
    def kernel(self) -> str:
        return self.function.split("(")[0].split()[-1] if self.function else ""

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "block": list(self.block),
            "thread": list(self.thread),
            "condition": self.condition,
        }


def parse_assertions(stderr: str) -> list[AssertionLine]:
    """Every distinct kernel assertion in `stderr`, in order of first appearance."""
    found: dict[tuple[str, str], AssertionLine] = {}
    for raw in stderr.splitlines():
        match = _ASSERT_LINE.match(raw.strip())
        if not match:
            continue
        line = AssertionLine(
            file=match["file"],
            line=int(match["line"]),
            function=match["function"],
            block=tuple(int(v) for v in match["block"].split(",")),
            thread=tuple(int(v) for v in match["thread"].split(",")),
            condition=match["condition"],
        )
        key = (line.function, line.condition)
        found.setdefault(key, line)
    return list(found.values())


def assertion_kind(condition: str) -> str:
    for pattern, kind in _ASSERTION_KINDS:
        if pattern.search(condition):
            return kind
    return normalize_message(condition)


def normalize_message(message: str) -> str:
    """The first line of a message with numbers replaced, so shrinking sizes keeps it equal."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = normalize_inductor(first)  # a generated kernel's cache file and temporaries
    first = _ADDRESS.sub("<address>", first)  # differs every run
    first = _SIZES.sub(lambda m: "x".join("<n>" for _ in m.group(0).split("x")), first)
    # a negative number keeps its sign: an index of -1 (a missing neighbour marked -1) is
    # another bug than an index past the end, though both read "index N is out of bounds"
    return _NUMBER.sub(lambda m: f"-{NUMBER}" if m.group(0)[0] == "-" else NUMBER, first).strip()


def number_pattern(message: str) -> tuple[int, ...]:
    """How the numbers of the message's first line relate, as `normalize_message` reads them
    (addresses and "32x32" sizes aside): 0 for a zero, else which distinct value it is (1 for
    the first seen, 2 for the next...). "index 6 is out of bounds for axis 0 with size 6" and
    "index 1 ... axis 0 with size 1" both give (1, 0, 1): an index equal to the size."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = _SIZES.sub("", _ADDRESS.sub("", normalize_inductor(first)))
    seen: dict[float, int] = {}
    pattern = []
    for match in _NUMBER.finditer(first):
        value = float(match.group(0))
        pattern.append(0 if value == 0 else seen.setdefault(value, len(seen) + 1))
    return tuple(pattern)


def same_numbers(original: str, message: str) -> bool:
    """Do `message`'s numbers relate as `original`'s do (zeros where it has zeros, equal where
    it has equal ones)? The kind leaves numbers out so that shrinking sizes keeps it equal, but
    the relation is part of the bug: a source reduction of a numpy kernel's "index 6 is out of
    bounds for axis 0 with size 6" (a segment id equal to the count) had slid to an
    `np.zeros(0)` output, "index 0 ... with size 0", and to "index 6 ... with size 1". Messages
    whose numbers do not line up (another kind) are left to the kind to compare."""
    mine, theirs = number_pattern(original), number_pattern(message)
    return len(mine) != len(theirs) or mine == theirs


def cuda_error_code(message: str) -> tuple[int | None, str | None]:
    """The CUDA error code and name mentioned in an exception message, if any."""
    for pattern in (_TRITON_ERROR, _CUDA_ERROR, _DRIVER_ERROR):
        match = pattern.search(message)
        if match:
            name = match.group(1).strip().rstrip(".")
            for text, code in CUDA_ERRORS.items():
                if name.startswith(text):
                    return code, text
            return None, name
    bare = _ERROR_NAME.search(message)
    if bare:
        text = _ERROR_NAMES[bare.group(1)]
        return CUDA_ERRORS[text], text
    return None, None


def is_cuda_failure(error_type: str, message: str, error_code: int | None = None) -> bool:
    """An asynchronous CUDA failure: it may belong to any earlier kernel, not to the call that
    raised it (unlike a host-side check such as "index out of range in self")."""
    if error_code is not None or error_type == "AcceleratorError":
        return True
    if "CUBLAS_STATUS" in message or "CUDNN_STATUS" in message or "CUDA error" in message:
        return True
    # a driver error's name, coded here or not (CuPy's CUDA_ERROR_INVALID_ADDRESS_SPACE, which
    # the H200 raised for a kernel handed host pointers, has no code in CUDA_ERRORS)
    return any(found is not None for found in cuda_error_code(message))


def device_in_words(error_type: str, message: str) -> str:
    """The device an error's own words name: "cuda" for a CUDA error (a cuBLAS or cuDNN status
    included) or the caching allocator's out of memory, else "cpu"."""
    cuda = is_cuda_failure(error_type, message) or "CUDA out of memory" in message
    return "cuda" if cuda else "cpu"


def classify(
    error_type: str,
    message: str,
    stderr: str = "",
    op: str | None = None,
    error_code: int | None = None,
) -> Signature:
    """The signature of a failure, from what a process showed of it. Every out-of-memory
    error has the kind "out of memory": its amounts depend on the device and what it held."""
    code, name = cuda_error_code(message)
    if error_code is None:
        error_code = code
    if is_out_of_memory(error_type, message):
        return Signature(error_type, error_code, op, OOM_KIND)
    if error_code is not None:
        assertions = parse_assertions(stderr)
        if assertions:
            kind = assertion_kind(assertions[0].condition)
        else:
            kind = name or normalize_message(message)
        return Signature(error_type, error_code, op, kind)
    library = _CUBLAS.search(message)
    if library:
        return Signature(error_type, None, op, library.group(1))
    return Signature(error_type, None, op, normalize_message(message))


CRASH = "Crash"  # the error type of a process that died without an exception to show


def crash_how(returncode: int) -> str:
    """ "signal 11" for a process killed by a signal (Popen's negative return code), else
    "exit code 3": the kind of a crash's Signature, which the repro must die with too."""
    return f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"


def crash_signature(returncode: int) -> Signature:
    return Signature(CRASH, None, None, crash_how(returncode))


def signal_name(returncode: int) -> str:
    """SIGSEGV for -11; "" when the code is not a signal's."""
    import signal

    try:
        return signal.Signals(-returncode).name if returncode < 0 else ""
    except ValueError:
        return ""


# the last line of a traceback: `pkg.Error: message` (or just the type)
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")


def last_exception(stderr: str) -> tuple[str, str] | None:
    """(type, message) of the last traceback in `stderr`: the unindented line after its frames."""
    lines = stderr.splitlines()
    start = max(
        (i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")), default=-1
    )
    if start < 0:
        return None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not line or line[0].isspace():
            continue
        match = _EXCEPTION_LINE.match(line)
        if match:
            message = "\n".join([match["message"] or "", *lines[i + 1 :]]).strip()
            return match["type"].rsplit(".", 1)[-1], message
    return None
