"""Edits of a ReproCase's tensors that several shrink passes make: a dimension cut (its known
values sliced with it), the dimensions that share a size, the tensor at a path."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from reprocut.model.case import Literal, ReproCase, TensorSpec
from reprocut.shrink.shrinker import Shrinker, known_values

Path = tuple[Any, ...]


def flat_values(shrinker: Shrinker, spec: TensorSpec) -> list[Any] | None:
    """Row-major values of a tensor whose values are known (Literal, or Captured and loaded).
    None for a sparse tensor: its data are its parts (sparse_passes.py cuts those)."""
    return None if spec.is_sparse else known_values(shrinker, spec)


def slice_values(values: Sequence[Any], shape: tuple[int, ...], dim: int, new: int) -> list[Any]:
    """Row-major values of the tensor cut to its first `new` entries along `dim`."""
    inner = math.prod(shape[dim + 1 :])
    outer = math.prod(shape[:dim])
    size = shape[dim]
    kept: list[Any] = []
    for o in range(outer):
        start = o * size * inner
        kept.extend(values[start : start + new * inner])
    return kept


def with_dim(shrinker: Shrinker, case: ReproCase, path: Path, dim: int, new: int) -> ReproCase:
    """`case` with dimension `dim` of the tensor at `path` cut to `new` (values sliced)."""
    spec = case.get(path)
    assert isinstance(spec, TensorSpec)
    shape = (*spec.shape[:dim], new, *spec.shape[dim + 1 :])
    values = spec.values
    known = flat_values(shrinker, spec)
    if known is not None:
        values = Literal(tuple(slice_values(known, spec.shape, dim, new)))
    return case.with_arg(path, replace(spec, shape=shape, values=values))


def linked_dims(case: ReproCase, size: int, skip: Path | None = None) -> list[tuple[Path, int]]:
    """Every (tensor, dim) of `case` whose size equals `size`: dims that probably must agree."""
    return [
        (path, dim)
        for path, spec in case.tensors()
        if path != skip
        for dim, extent in enumerate(spec.shape)
        if extent == size
    ]


def with_dims(
    shrinker: Shrinker, case: ReproCase, dims: list[tuple[Path, int]], new: int
) -> ReproCase:
    for path, dim in dims:
        case = with_dim(shrinker, case, path, dim, new)
    return case


def spec_at(case: ReproCase, path: Path) -> TensorSpec | None:
    """The tensor at `path` in `case` (None: no tensor there any more)."""
    try:
        spec = case.get(path)
    except (IndexError, KeyError, AssertionError):
        return None
    return spec if isinstance(spec, TensorSpec) else None
