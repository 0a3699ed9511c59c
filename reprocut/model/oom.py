"""Out of memory as its own class of failure: recognizing it, and what its message says.

An allocation that fails is not a fault in the op that asked: the op is innocent when other
memory was held, guilty when its request alone is too large. So an OOM keeps one signature kind
("out of memory") whatever the amounts, and the amounts are read from the message here: the
bytes asked for, and on CUDA the device's total and free memory and what PyTorch held.
A leaf module: it imports nothing from reprocut.
"""

from __future__ import annotations

import re

OOM_KIND = "out of memory"

_CPU_REFUSALS = (
    "can't allocate memory",  # the CPU allocator ("DefaultCPUAllocator: can't allocate memory")
    "not enough memory: you tried to allocate",  # older torch on CPU
)
_MARKERS = (
    "CUDA out of memory",  # torch.OutOfMemoryError from the caching allocator
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "CUDA error: out of memory",
    *_CPU_REFUSALS,
    "MPS backend out of memory",
)

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_CPU_REQUEST = re.compile(r"you tried to allocate (\d+) bytes")
_CUDA_REQUEST = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_CUDA_DEVICE = re.compile(
    r"total capacity of ([\d.]+) (B|KiB|MiB|GiB|TiB) of which ([\d.]+) (B|KiB|MiB|GiB|TiB) is free"
)


def cpu_allocator_refused(message: str) -> bool:
    """The CPU allocator refused the request itself (malloc failed), in either torch's words."""
    return any(refusal in message for refusal in _CPU_REFUSALS)


def is_out_of_memory(error_type: str, message: str) -> bool:
    """An allocation failed: torch.OutOfMemoryError, a cuBLAS/cuDNN workspace, the CUDA
    runtime's cudaErrorMemoryAllocation, or the CPU allocator's refusal."""
    if error_type == "OutOfMemoryError":
        return True
    return any(marker in message for marker in _MARKERS)


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def requested_bytes(message: str) -> int | None:
    """The size of the allocation that failed, as the message gives it (CUDA rounds it to two
    decimals of its unit)."""
    cpu = _CPU_REQUEST.search(message)
    if cpu:
        return int(cpu.group(1))
    cuda = _CUDA_REQUEST.search(message)
    return _bytes(*cuda.groups()) if cuda else None


_PYTORCH_ALLOCATED = re.compile(
    r"Of the allocated memory ([\d.]+) (B|KiB|MiB|GiB|TiB) is allocated"
)


def allocated_in_message(message: str) -> int | None:
    """The bytes PyTorch had allocated when the allocation failed, as CUDA's message says."""
    match = _PYTORCH_ALLOCATED.search(message)
    return _bytes(*match.groups()) if match else None


def figures_agree(said: int, read: int) -> bool:
    """A message's figure (two decimals of its unit) against an exact one."""
    return abs(said - read) <= 0.01 * said + (1 << 20)


def device_figures(message: str) -> tuple[int | None, int | None]:
    """(total, free) bytes of the GPU, as the CUDA OOM message gives them."""
    match = _CUDA_DEVICE.search(message)
    if not match:
        return None, None
    total, total_unit, free, free_unit = match.groups()
    return _bytes(total, total_unit), _bytes(free, free_unit)


def format_bytes(count: int | float | None, digits: int = 2) -> str:
    """232.83 GiB, as PyTorch's own messages write sizes (`digits` after the point)."""
    if count is None:
        return "unknown"
    value = float(count)
    sign = "-" if value < 0 else ""
    value = abs(value)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.{digits}f} {unit}"


def snapshot_free_blocks(segments: list[dict]) -> tuple[int, bool]:
    """From `torch.cuda.memory_snapshot()`'s segments: the largest block the caching allocator
    holds unallocated ("inactive"), and whether its segments are expandable already."""
    largest = max(
        (
            int(block.get("size", 0))
            for segment in segments
            for block in segment.get("blocks", ())
            if block.get("state") == "inactive"
        ),
        default=0,
    )
    return largest, any(bool(segment.get("is_expandable")) for segment in segments)


# C++ frames of an allocation a library made through PyTorch's allocator for itself
_LIBRARY_FRAME = re.compile(r"blas|cudnn|cufft|cusparse|cusolver", re.IGNORECASE)


def library_blocks(segments: list[dict], tracked: set[int]) -> int:
    """From an allocator snapshot taken with its history: bytes of live blocks that no op
    made (not in `tracked`, the data pointers of every storage an op made) whose allocation
    stack is a math library's (cuBLAS and cuBLASLt workspaces: 2 x 32 MiB per stream on an
    H200). Without recorded stacks nothing is recognized."""
    return sum(
        int(block.get("size", 0))
        for segment in segments
        for block in segment.get("blocks", ())
        if block.get("state") == "active_allocated"
        and int(block.get("address", -1)) not in tracked
        and any(_LIBRARY_FRAME.search(str(f.get("name", ""))) for f in block.get("frames") or ())
    )
