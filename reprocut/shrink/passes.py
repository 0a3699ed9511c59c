"""The named shrink passes. Each does one sweep over `shrinker.best`, proposing candidates to
`shrinker.consider`; the loop in shrinker.py repeats them to a fixed point.

Passes re-read `shrinker.best` after every consider (it may have changed) and never touch torch:
they work on the data model, so each can be tested against a pure-Python predicate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from reprocut.model.case import (
    DTYPE_RANK,
    FLOAT_DTYPES,
    INT_DTYPES,
    ArgList,
    Generated,
    Literal,
    ReproCase,
    TensorSpec,
)
from reprocut.model.nonfinite import offending
from reprocut.shrink.case_edits import (
    Path,
    flat_values,
    linked_dims,
    spec_at,
    with_dim,
    with_dims,
)
from reprocut.shrink.layout_passes import (
    make_contiguous,
    merge_dimensions,
    merge_dimensions_ahead,
    zero_storage_offset,
)
from reprocut.shrink.shrinker import Shrinker, find_integer, keep_chunks
from reprocut.shrink.sparse_passes import SPARSE_PASSES
from reprocut.source.integer_search import first_integers, searches_below, smaller_integers


def op_name(case: ReproCase) -> str:
    """`embedding` for `torch.nn.functional.embedding` and `torch.ops.aten.embedding.default`."""
    parts = case.target.split(".")
    if parts[:3] == ["torch", "ops", "aten"] and len(parts) >= 4:
        return parts[3]
    return parts[-1]


def _scalar(case: ReproCase, index: int, name: str, default: Any = None) -> Any:
    if index < len(case.args):
        return case.args[index]
    return dict(case.kwargs).get(name, default)


def _tensor(case: ReproCase, index: int) -> TensorSpec | None:
    arg = case.args[index] if index < len(case.args) else None
    return arg if isinstance(arg, TensorSpec) else None


# --- pass: drop_optional_kwargs ---------------------------------------------------------------


def drop_optional_kwargs(shrinker: Shrinker) -> None:
    """Drop each keyword argument (back to its default), then trailing positional scalars."""
    for name, _ in shrinker.best.kwargs:
        if any(existing == name for existing, _ in shrinker.best.kwargs):
            shrinker.consider(shrinker.best.without_kwarg(name))
    while shrinker.best.args and not isinstance(shrinker.best.args[-1], (TensorSpec, ArgList)):
        if not shrinker.consider(replace(shrinker.best, args=shrinker.best.args[:-1])):
            break


# --- pass: shrink_dimensions ------------------------------------------------------------------


def shrink_dimensions(shrinker: Shrinker) -> None:
    """Each dimension of each tensor: to 1, then halving, then by one (find_integer).

    A dimension shared with other tensors (batch, classes) is first cut in all of them together.
    """
    paths = [path for path, _ in shrinker.best.tensors()]
    for path in paths:
        dim = 0
        while True:
            spec = spec_at(shrinker.best, path)
            if spec is None or dim >= len(spec.shape):
                break
            _shrink_one_dimension(shrinker, path, dim)
            dim += 1


def _try_size(shrinker: Shrinker, path: Path, dim: int, new: int) -> bool:
    return shrinker.consider_first(_sized(shrinker, path, dim, new))


def _sized(shrinker: Shrinker, path: Path, dim: int, new: int) -> list[ReproCase]:
    """The candidates with `path`'s dimension `dim` cut to `new`: in every tensor that shares
    its size, in the others that do, or alone."""
    spec = spec_at(shrinker.best, path)
    if spec is None or dim >= len(spec.shape) or not 1 <= new < spec.shape[dim]:
        return []
    size = spec.shape[dim]
    everywhere = linked_dims(shrinker.best, size)  # square images: H and W of every tensor
    others = linked_dims(shrinker.best, size, skip=path)  # batch or classes shared by tensors
    alone = with_dim(shrinker, shrinker.best, path, dim, new)
    candidates = []
    if len(everywhere) > len(others) + 1:
        candidates.append(with_dims(shrinker, shrinker.best, everywhere, new))
    if others:
        candidates.append(with_dims(shrinker, alone, others, new))
    candidates.append(alone)
    return candidates


def _shrink_one_dimension(shrinker: Shrinker, path: Path, dim: int) -> None:
    if shrinker.ways > 2:
        _search_dimension(shrinker, path, dim)
        return
    if _try_size(shrinker, path, dim, 1):
        return
    while True:
        spec = spec_at(shrinker.best, path)
        if (
            spec is None
            or spec.shape[dim] < 4
            or not _try_size(shrinker, path, dim, spec.shape[dim] // 2)
        ):
            break
    spec = spec_at(shrinker.best, path)
    if spec is None:
        return
    size = spec.shape[dim]
    find_integer(lambda k: k < size and _try_size(shrinker, path, dim, size - k))


def _search_dimension(shrinker: Shrinker, path: Path, dim: int) -> None:
    """The smallest round size that still fails (reprocut.source.integer_search). First 1, half
    and the round size below (`first_integers`): all three rejected, the size is one the
    failure needs, three checks; one accepted, the span below it is searched, its cuts
    checked side by side (smallest first: the first accepted in order is the smallest that
    failed), on a log scale while it spans more than a factor of four. A memory fault's
    captured call checks for seconds each on the H200 (a triton_op's 129 checks, 350 s), and
    each round of accepted sizes waits for the one before."""
    low = 0  # the largest size known not to fail
    searching = False
    while True:
        spec = spec_at(shrinker.best, path)
        if spec is None or dim >= len(spec.shape):
            return
        size = spec.shape[dim]
        if searching:
            sizes = smaller_integers(size, low, shrinker.ways)
        else:
            sizes = first_integers(size, low)
        if not shrinker.consider_first(
            [c for new in sizes for c in _sized(shrinker, path, dim, new)]
        ):
            return
        accepted = spec_at(shrinker.best, path)
        if accepted is None or dim >= len(accepted.shape):
            return
        new = accepted.shape[dim]
        low = max([low, *(tried for tried in sizes if tried < new)])
        searching = searching or searches_below(size, new)


# --- pass: cut_index_to_offender ----------------------------------------------------------------


def valid_range(case: ReproCase, path: Path) -> tuple[float, float] | None:
    """The [low, high) range the values of the tensor at `path` must lie in, from the other args.

    Known for the ops whose range checks cause device-side asserts; None where unknown.
    """
    if path[0] != "args" or len(path) > 3:
        return None
    if len(path) == 3:  # a list of index tensors: x[i, j], index_put_(x, [i, j], v)
        name = op_name(case)
        indexing = ("__getitem__", "__setitem__", "index_put", "index_put_", "_index_put_impl_")
        base = _tensor(case, 0)
        if name in indexing and path[1] == 1 and base is not None and path[2] < len(base.shape):
            return (-base.shape[path[2]], base.shape[path[2]])
        return None
    index = path[1]
    target = op_name(case)
    first = _tensor(case, 0)
    if target in ("embedding", "embedding_bag", "_embedding_bag"):
        # F.embedding(ids, weight) but aten::embedding(weight, ids)
        ids_at, weight_at = (1, 0) if case.target.startswith("torch.ops.") else (0, 1)
        weight = _tensor(case, weight_at)
        if index == ids_at and weight is not None and weight.shape:
            return (0, weight.shape[0])
        return None
    if target in ("cross_entropy", "nll_loss") and index == 1 and first is not None:
        classes = first.shape[1] if len(first.shape) >= 2 else first.shape[0] if first.shape else 0
        return (0, classes)
    if target in ("gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
                  "index_select", "index_add", "index_add_", "index_copy", "index_copy_",
                  "index_fill", "index_fill_") and index == 2 and first is not None:  # fmt: skip
        dim = _scalar(case, 1, "dim", 0)
        if isinstance(dim, int) and -len(first.shape) <= dim < len(first.shape):
            size = first.shape[dim]
            return (-size, size)
    if target == "one_hot" and index == 0:
        classes = _scalar(case, 1, "num_classes", -1)
        if isinstance(classes, int) and classes > 0:
            return (0, classes)
    if target == "__getitem__" and index == 1 and first is not None and first.shape:
        return (-first.shape[0], first.shape[0])
    return None


def _is_bad_float(value: Any, low: float, high: float) -> bool:
    return not isinstance(value, (int, float)) or math.isnan(value) or not low <= value <= high


def offenders(case: ReproCase, path: Path, values: Sequence[Any]) -> list[int]:
    """Positions of values that break the op's contract (out of range, NaN, negative probability)."""
    spec = case.get(path)
    assert isinstance(spec, TensorSpec)
    target = op_name(case)
    if spec.dtype in INT_DTYPES:
        bounds = valid_range(case, path)
        if bounds is None:
            return []
        low, high = bounds
        ignore = _scalar(case, 4, "ignore_index", -100) if target == "cross_entropy" else None
        return [i for i, v in enumerate(values) if not low <= v < high and v != ignore]
    if spec.dtype in FLOAT_DTYPES:
        rule = offending(case.target, path[1], spec.dtype) if len(path) == 2 else None
        if case.check_finite and rule is not None:  # the values that make the op non-finite
            return [i for i, v in enumerate(values) if isinstance(v, (int, float)) and rule(v)]
        if target in ("multinomial",):
            return [i for i, v in enumerate(values) if _is_bad_float(v, 0.0, math.inf)]
        if target in ("binary_cross_entropy",) and path[:2] == ("args", 0):
            return [i for i, v in enumerate(values) if _is_bad_float(v, 0.0, 1.0)]
        return [i for i, v in enumerate(values) if isinstance(v, float) and not math.isfinite(v)]
    return []


def _cut_shape(spec: TensorSpec, count: int) -> tuple[int, ...]:
    if len(spec.shape) <= 1:
        return (count,)
    return (*((1,) * (len(spec.shape) - 1)), count)


def _with_kept(
    shrinker: Shrinker, case: ReproCase, path: Path, keep: Sequence[int]
) -> list[ReproCase]:
    """The tensor at `path` cut to the elements at `keep`: alone, and with linked dims cut too."""
    spec = case.get(path)
    assert isinstance(spec, TensorSpec)
    values = flat_values(shrinker, spec)
    assert values is not None
    shape = _cut_shape(spec, len(keep))
    new_spec = replace(
        spec,
        shape=shape,
        stride=None,
        storage_offset=0,
        values=Literal(tuple(values[i] for i in keep)),
    )
    alone = case.with_arg(path, new_spec)
    candidates = []
    changed = [  # a dim cut shorter (one a cut to `(1, k)` lengthens links to nothing: a
        # size-1 dim of another tensor is no batch this one shares)
        (d, old, new)
        for d, (old, new) in enumerate(zip(spec.shape, shape, strict=False))
        if new < old
    ]
    if len(spec.shape) == len(shape) and changed:
        linked = alone
        for _, old, new in changed:
            linked = with_dims(shrinker, linked, linked_dims(linked, old, skip=path), new)
        if linked != alone:
            candidates.append(linked)
    candidates.append(alone)
    return candidates


def _try_keep(shrinker: Shrinker, path: Path, *keeps: Sequence[int]) -> bool:
    """Keep the elements of the first of `keeps` that still fails (side by side if it can)."""
    spec = spec_at(shrinker.best, path)
    kept = [k for k in keeps if spec is not None and k and len(k) < spec.numel]
    return shrinker.consider_first([c for k in kept for c in _with_kept(shrinker, shrinker.best, path, k)])  # fmt: skip


def cut_index_to_offender(shrinker: Shrinker) -> None:
    """Keep only the offending elements of index/target/probability tensors (ids >= num_embeddings,
    NaN probabilities), then only the first of them; where no rule knows the range, try the
    extreme values alone, then bisect."""
    for path, _ in list(shrinker.best.tensors()):
        spec = spec_at(shrinker.best, path)
        if spec is None or spec.numel <= 1:
            continue
        values = flat_values(shrinker, spec)
        if values is None:
            continue
        bad = offenders(shrinker.best, path, values)
        if bad and _try_keep(shrinker, path, bad[:1], bad):
            continue
        if spec.dtype not in INT_DTYPES or bad:
            continue  # float data without a bad value is left to the generator pass
        order = sorted(range(len(values)), key=lambda i: values[i])
        if _try_keep(shrinker, path, [order[-1]], [order[0]]):
            continue
        _bisect_elements(shrinker, path)


def _bisect_elements(shrinker: Shrinker, path: Path, max_chunks: int = 8) -> None:
    """Keep halves (then quarters, eighths) of the flat elements while the failure holds;
    shrink_dimensions still cuts a tensor whose failure needs many scattered elements."""

    def count() -> int | None:
        spec = spec_at(shrinker.best, path)
        if spec is None or spec.numel <= 1 or flat_values(shrinker, spec) is None:
            return None
        return spec.numel

    keep_chunks(count, lambda kept: _try_keep(shrinker, path, kept), max_chunks)


# --- pass: replace_values_with_generator --------------------------------------------------------


def _generators_for(spec: TensorSpec) -> list[Generated]:
    if spec.dtype in FLOAT_DTYPES or spec.dtype.startswith("complex"):
        return [Generated("zeros"), Generated("ones"), Generated("randn")]
    return [Generated("zeros"), Generated("ones")]


def replace_values_with_generator(shrinker: Shrinker) -> None:
    """Captured or literal values that do not matter become zeros, ones or randn.

    Tensors holding offending values (an id >= num_embeddings, a NaN probability) keep them: the
    repro should show the bad value, not a generator that happens to trip the same check.
    """
    for path, _ in list(shrinker.best.tensors()):
        current = spec_at(shrinker.best, path)
        if current is None or current.is_sparse:
            continue  # a sparse tensor's values are its parts': generate_sparse_values
        known = flat_values(shrinker, current)
        if known is not None and offenders(shrinker.best, path, known):
            continue
        candidates = []
        for generated in _generators_for(current):
            if current.values == generated:
                break
            candidates.append(shrinker.best.with_arg(path, replace(current, values=generated)))
        shrinker.consider_first(candidates)


# --- passes on layout, dtype and device ---------------------------------------------------------


def _convert_values(values: Any, dtype: str) -> Any:
    if (
        isinstance(values, Literal)
        and dtype in INT_DTYPES
        and not all(isinstance(v, (int, bool)) for v in values.values)
    ):
        return None
    return values


def simplify_dtype(shrinker: Shrinker) -> None:
    """Each tensor to a simpler dtype of the same family (float16 -> float32, int32 -> int64)."""
    for path, _ in list(shrinker.best.tensors()):
        spec = spec_at(shrinker.best, path)
        if spec is None:
            continue
        family = (
            FLOAT_DTYPES
            if spec.dtype in FLOAT_DTYPES
            else INT_DTYPES
            if spec.dtype in INT_DTYPES
            else set()
        )
        rank = DTYPE_RANK.get(spec.dtype, len(DTYPE_RANK))
        candidates = []
        for dtype in sorted(family, key=lambda d: DTYPE_RANK[d]):
            if DTYPE_RANK[dtype] >= rank:
                break
            values = _convert_values(spec.values, dtype)
            if values is not None:
                candidates.append(
                    shrinker.best.with_arg(path, replace(spec, dtype=dtype, values=values))
                )
        shrinker.consider_first(candidates)


def drop_requires_grad(shrinker: Shrinker) -> None:
    """A forward-only failure does not need autograd on its inputs."""
    for path, _ in list(shrinker.best.tensors()):
        spec = spec_at(shrinker.best, path)
        if spec is not None and spec.requires_grad:
            shrinker.consider(shrinker.best.with_arg(path, replace(spec, requires_grad=False)))


def move_to_cpu(shrinker: Shrinker) -> None:
    """All tensors to the CPU, only when the bug is CPU-visible (the predicate still decides)."""
    if not shrinker.cpu_visible:
        return
    case = shrinker.best
    for path, spec in list(case.tensors()):
        if spec.device != "cpu":
            case = case.with_arg(path, replace(spec, device="cpu"))
    if case != shrinker.best:
        shrinker.consider(case)


PASSES = [
    drop_optional_kwargs,
    cut_index_to_offender,
    *SPARSE_PASSES,
    replace_values_with_generator,
    merge_dimensions_ahead,  # a memory fault's tensors searched as one dimension each
    shrink_dimensions,
    merge_dimensions,  # after, otherwise: a round of the dimensions first. A kernel's overrun
    # depends on its tensors' sizes together, so where a shrink ends depends on its path: on the
    # H200 cuda_triton_op_compiled ended at 19.4 M elements merged first, at 0.58-69 M with the
    # dimensions first (its last ten runs)
    simplify_dtype,
    make_contiguous,
    zero_storage_offset,
    drop_requires_grad,
    move_to_cpu,
]
