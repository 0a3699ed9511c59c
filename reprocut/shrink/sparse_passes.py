"""Shrink passes for sparse COO and CSR arguments: fewer stored entries, values generated.

A sparse tensor's bug is usually in its indices (a column id past the size), so these passes
keep the recorded index values and cut the *entries*: the offending ones alone when some index
is out of range, else halves of them. The values part becomes a generator. No pass here or in
passes.py changes a tensor's layout: a sparse argument stays sparse, and its size is shrunk by
`shrink_dimensions` like any other tensor's shape.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from reprocut.model.case import Generated, Literal, ReproCase, TensorSpec
from reprocut.shrink.shrinker import Shrinker, keep_chunks, known_values

Path = tuple[Any, ...]
Coordinates = list[tuple[int, ...]]


def _sparse_specs(case: ReproCase) -> list[Path]:
    return [path for path, spec in case.tensors() if spec.is_sparse]


def _spec(case: ReproCase, path: Path) -> TensorSpec | None:
    try:
        spec = case.get(path)
    except (IndexError, KeyError, AssertionError):
        return None
    return spec if isinstance(spec, TensorSpec) and spec.is_sparse else None


def nnz(spec: TensorSpec) -> int:
    """Stored entries: the values part's first dimension."""
    values = spec.part("values")
    return values.shape[0] if values.shape else 0


def coordinates(shrinker: Shrinker, spec: TensorSpec) -> Coordinates | None:
    """Each stored entry's coordinates over the sparse dims (None when indices are unknown)."""
    count = nnz(spec)
    if spec.layout == "sparse_coo":
        indices = spec.part("indices")
        flat = known_values(shrinker, indices)
        if flat is None or len(indices.shape) != 2:
            return None
        dims = indices.shape[0]
        return [tuple(int(flat[d * count + k]) for d in range(dims)) for k in range(count)]
    if spec.layout == "sparse_csr":
        crow = known_values(shrinker, spec.part("crow_indices"))
        col = known_values(shrinker, spec.part("col_indices"))
        if crow is None or col is None or not valid_crow(crow, count):
            return None
        rows = [row for row in range(len(crow) - 1) for _ in range(crow[row + 1] - crow[row])]
        return [(rows[k], int(col[k])) for k in range(count)]
    return None


def valid_crow(crow: Sequence[int], count: int) -> bool:
    """Compressed row pointers that can be cut entry by entry: from 0, non-decreasing, to nnz."""
    return (
        bool(crow)
        and crow[0] == 0
        and crow[-1] == count
        and all(a <= b for a, b in itertools.pairwise(crow))
    )


def offending_entries(spec: TensorSpec, coords: Coordinates) -> list[int]:
    """Entries with a coordinate outside the sparse size (negative, or >= the dim's size)."""
    sizes = spec.shape[: len(coords[0])] if coords else ()
    return [
        k
        for k, point in enumerate(coords)
        if any(not 0 <= c < n for c, n in zip(point, sizes, strict=False))
    ]


def with_entries(
    shrinker: Shrinker, spec: TensorSpec, coords: Coordinates, keep: Sequence[int], *,
    zero_valid: bool = False,
) -> TensorSpec:  # fmt: skip
    """`spec` storing only the entries at `keep` (index values as recorded; with `zero_valid`,
    coordinates inside the size become 0, so the size can shrink around the bad one)."""
    points = [coords[k] for k in keep]
    if zero_valid:
        sizes = spec.shape
        points = [
            tuple(c if not 0 <= c < sizes[d] else 0 for d, c in enumerate(point))
            for point in points
        ]
    values = spec.part("values")
    inner = math.prod(values.shape[1:])
    known = known_values(shrinker, values)
    new_values = replace(values, shape=(len(keep), *values.shape[1:]), stride=None)
    if known is not None:
        kept = [v for k in keep for v in known[k * inner : (k + 1) * inner]]
        new_values = replace(new_values, values=Literal(tuple(kept)))
    if spec.layout == "sparse_coo":
        dims = len(points[0]) if points else spec.part("indices").shape[0]
        flat = tuple(point[d] for d in range(dims) for point in points)
        indices = replace(spec.part("indices"), shape=(dims, len(keep)), values=Literal(flat))
        return replace(spec, parts=(indices, new_values))
    rows = spec.part("crow_indices").shape[0] - 1
    crow = [0] * (rows + 1)
    for row, _ in points:
        crow[min(max(row, 0), rows - 1) + 1] += 1
    for row in range(rows):
        crow[row + 1] += crow[row]
    crow_spec = replace(spec.part("crow_indices"), values=Literal(tuple(crow)))
    col = replace(
        spec.part("col_indices"), shape=(len(keep),), values=Literal(tuple(c for _, c in points))
    )
    return replace(spec, parts=(crow_spec, col, new_values))


def _try_keep(shrinker: Shrinker, path: Path, keep: Sequence[int]) -> bool:
    spec = _spec(shrinker.best, path)
    if spec is None or not keep or len(keep) >= nnz(spec):
        return False
    coords = coordinates(shrinker, spec)
    if coords is None:
        return False
    candidates = [with_entries(shrinker, spec, coords, keep, zero_valid=True)]
    candidates.append(with_entries(shrinker, spec, coords, keep))
    return any(
        shrinker.consider(shrinker.best.with_arg(path, candidate))
        for candidate in dict.fromkeys(candidates)
    )


def cut_sparse_to_offender(shrinker: Shrinker) -> None:
    """Keep only the stored entries with an index outside the size (the first alone, then
    all of them); where every index is inside, keep halves, then quarters, of the entries."""
    for path in _sparse_specs(shrinker.best):
        spec = _spec(shrinker.best, path)
        if spec is None or nnz(spec) <= 1:
            continue
        coords = coordinates(shrinker, spec)
        if coords is None:
            continue
        bad = offending_entries(spec, coords)
        if bad and (_try_keep(shrinker, path, bad[:1]) or _try_keep(shrinker, path, bad)):
            continue
        _bisect_entries(shrinker, path)


def _bisect_entries(shrinker: Shrinker, path: Path, max_chunks: int = 8) -> None:
    def count() -> int | None:
        spec = _spec(shrinker.best, path)
        return None if spec is None else nnz(spec)

    keep_chunks(count, lambda kept: _try_keep(shrinker, path, kept), max_chunks)


def generate_sparse_values(shrinker: Shrinker) -> None:
    """A sparse tensor's stored values, when they do not matter, become zeros or ones (its
    indices keep their recorded values)."""
    for path in _sparse_specs(shrinker.best):
        for kind in ("zeros", "ones"):
            spec = _spec(shrinker.best, path)
            if spec is None:
                break
            values = spec.part("values")
            if isinstance(values.values, Generated):
                break
            candidate = spec.with_part("values", replace(values, values=Generated(kind)))
            if shrinker.consider(shrinker.best.with_arg(path, candidate)):
                break


SPARSE_PASSES = [cut_sparse_to_offender, generate_sparse_values]
