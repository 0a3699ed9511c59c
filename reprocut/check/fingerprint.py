"""memcheck's report ▶ a memory fault's fingerprint, and two of them compared.

The fingerprint (reprocut.model.fingerprint) is read from memcheck's first access error: the
kernel, the access and its size, and where the address falls. "Where" comes from memcheck's own
"N bytes after/before the nearest allocation" line when it prints one (both runs go with
`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, so an allocation is a tensor's storage), else from the
tensors the wrapper saw; the tensor's name is shown, never compared (a repro renames).
"""

from __future__ import annotations

from collections.abc import Sequence

from reprocut.check.memcheck import MemcheckError, TensorRange, nearest_tensor
from reprocut.check.sanitizer import Evidence
from reprocut.model.fingerprint import (
    BEFORE_START,
    INSIDE,
    MISALIGNED,
    PAST_END,
    MemoryFingerprint,
    SameBug,
    kernel_key,
)

UNAVAILABLE = "compute-sanitizer is not installed: the fingerprint could not be checked"


def _containing(address: int, tensors: Sequence[TensorRange]) -> TensorRange | None:
    return next((t for t in tensors if t.storage_start <= address < t.storage_end), None)


def relation(error: MemcheckError, tensors: Sequence[TensorRange]) -> tuple[str | None, str]:
    """(where the address falls, the tensor or allocation it is relative to)."""
    address = error.address
    if error.problem == "misaligned":
        found = None if address is None else _containing(address, tensors)
        return MISALIGNED, "" if found is None else found.label()
    nearest = _nearest_tensor(address, tensors)
    if error.nearest is not None:  # what memcheck measured: the relation
        side, _, base, size = error.nearest
        named = next((t for t in tensors if t.storage_start == base), nearest)
        target = named.label() if named is not None else f"an allocation of {size} B"
        return (PAST_END if side == "after" else BEFORE_START), target
    if address is None or nearest is None:
        return None, ""
    if nearest.storage_start <= address < nearest.storage_end:
        return INSIDE, nearest.label()
    return (BEFORE_START if address < nearest.storage_start else PAST_END), nearest.label()


def _nearest_tensor(address: int | None, tensors: Sequence[TensorRange]) -> TensorRange | None:
    if address is None or not tensors:
        return None
    return nearest_tensor(address, tensors)


def memory_fingerprint(evidence: Evidence | None, op: str | None) -> MemoryFingerprint | None:
    """The fingerprint of memcheck's first access error (None: it saw none). `op`: the aten
    op that faulted, when one did: its kernel (and access size) depend on shapes, so the op
    stands for the kernel."""
    if evidence is None or evidence.status != "found":
        return None
    first = evidence.report.first_access
    if first is None:
        return None
    where, target = relation(first, evidence.tensors)
    aten = bool(op) and str(op).startswith("aten::")
    kernel = op if aten else kernel_key(first.kernel)
    kinds = sorted(
        {e.access for e in evidence.report.errors if e.access and e.kernel == first.kernel}
    )
    return MemoryFingerprint(kernel, first.access, first.size, where, target, by_kernel=not aten,
                             accesses=tuple(kinds))  # fmt: skip


def compare(original: Evidence | None, repro: Evidence | None, op: str | None) -> SameBug:
    """The repro's memcheck fingerprint against the original's, part by part."""
    if original is None or repro is None or "unavailable" in (original.status, repro.status):
        return SameBug("memcheck", None, None, None, skipped=(UNAVAILABLE,))
    mine, theirs = memory_fingerprint(original, op), memory_fingerprint(repro, op)
    if mine is None:
        why = original.note or f"memcheck: {original.status}"
        return SameBug("memcheck", None, _json(theirs), None,
                       skipped=(f"no access error seen in the original ({why})",))  # fmt: skip
    if theirs is None:
        why = repro.note or f"memcheck: {repro.status}"
        return SameBug("memcheck", mine.to_json(), None, False, differ=(f"repro: {why}",))
    differ, unknown = mine.differences(theirs)
    skipped = tuple(f"{name}: not reported by memcheck" for name in unknown)
    return SameBug("memcheck", mine.to_json(), theirs.to_json(), not differ, skipped, tuple(differ),
                   parts=mine.parts(theirs))  # fmt: skip


def _json(fingerprint: MemoryFingerprint | None) -> dict | None:  # type: ignore[type-arg]
    return None if fingerprint is None else fingerprint.to_json()
