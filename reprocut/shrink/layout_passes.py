"""Shrink passes on a tensor's layout: its number of dimensions, its strides, its offset.

Values are kept row-major (see passes.py), so a contiguous tensor's values carry over to
any shape of the same elements, and dropping strides or an offset keeps them too.
"""

from __future__ import annotations

from dataclasses import replace

from reprocut.model.case import Captured
from reprocut.shrink.case_edits import spec_at
from reprocut.shrink.shrinker import Shrinker


def merge_dimensions(shrinker: Shrinker) -> None:
    """Contiguous tensors of several dimensions as one dimension of the same elements: all at
    once, else each alone. A kernel that reads `numel()` elements fails past a size, however it
    is shaped: searched as one dimension (the next round's shrink_dimensions) that size is
    found in one search, where three were found in turn, each round shaving the others' (the
    triton_op of cuda_triton_op_compiled took 100 s of such rounds for the last 1.5% of its
    elements on the H200). A kernel that needs the shape keeps it (the check says so)."""
    flat = [
        (path, replace(spec, shape=(spec.numel,), stride=None))
        for path, spec in shrinker.best.tensors()
        if len(spec.shape) > 1 and spec.is_contiguous and not spec.is_sparse
        and not isinstance(spec.values, Captured)  # a captured file keeps its shape
    ]  # fmt: skip
    candidates = [shrinker.best.with_arg(path, spec) for path, spec in flat]
    if len(flat) > 1:
        together = shrinker.best
        for path, spec in flat:
            together = together.with_arg(path, spec)
        candidates.insert(0, together)
    shrinker.consider_first(candidates)


def merge_dimensions_ahead(shrinker: Shrinker) -> None:
    """merge_dimensions before the dimensions are searched, for a memory fault's call (its
    searches cut several ways at once: `ways` > 2). Its kernel overruns by how many elements a
    tensor spans, and one search of that count ends where three searches in turn end, for
    fewer checks: 24 against 43 to the same 20.97 M elements in a CPU model of
    cuda_triton_op_compiled's gated op (a fault from 20.97 M elements on), each check on the
    H200 a second or more. Where the op ends there varied from run to run with the dimensions
    searched first (0.58-69 M elements over its last ten runs, the smallest after 181 checks).
    One search at a time (a CPU op, a device assert) keeps the dimensions-first order."""
    if shrinker.ways > 2:
        merge_dimensions(shrinker)


def make_contiguous(shrinker: Shrinker) -> None:
    """Drop a tensor's explicit strides (values are row-major, so they carry over)."""
    for path, _ in list(shrinker.best.tensors()):
        spec = spec_at(shrinker.best, path)
        if spec is not None and not spec.is_contiguous:
            shrinker.consider(shrinker.best.with_arg(path, replace(spec, stride=None)))


def zero_storage_offset(shrinker: Shrinker) -> None:
    for path, _ in list(shrinker.best.tensors()):
        spec = spec_at(shrinker.best, path)
        if spec is not None and spec.storage_offset:
            shrinker.consider(shrinker.best.with_arg(path, replace(spec, storage_offset=0)))
