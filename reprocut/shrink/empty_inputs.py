"""An out-of-memory call ▶ the same call on inputs that hold no values: `torch.empty` of the
recorded shapes, strides and dtypes.

When the request alone exceeds the device, the failure depends on sizes only, so the repro
needs neither the captured data nor a reduction. A stride-0 (expanded) input keeps its strides
(`torch.empty_strided`): the expand is what makes the request big while the input stays small.
Integer and bool inputs are zeros instead (indices 0 are in range for any non-empty dimension).
An aten target is called by its public name where torch has one (`torch.ops.aten.eq.Tensor`
becomes `torch.eq`).
"""

from __future__ import annotations

from dataclasses import replace

from reprocut.model.case import FLOAT_DTYPES, Generated, ReproCase, TensorSpec

EMPTY = Generated("empty")
ZEROS = Generated("zeros")


def public_target(case: ReproCase) -> str | None:
    """The public dotted path for the case's call, or None when torch has none."""
    if not case.target.startswith("torch.ops."):
        return case.target
    parts = case.target.split(".")
    if len(parts) < 4 or parts[2] != "aten" or parts[3].startswith("_"):
        return None
    import torch

    name = parts[3]
    if callable(getattr(torch, name, None)):
        return f"torch.{name}"
    if callable(getattr(torch.Tensor, name, None)):
        return f"torch.Tensor.{name}"
    return None


def _empty_spec(spec: TensorSpec, *, grad: bool) -> TensorSpec:
    floating = spec.dtype in FLOAT_DTYPES or spec.dtype.startswith("complex")
    return replace(
        spec,
        values=EMPTY if floating else ZEROS,
        requires_grad=spec.requires_grad and grad and floating,
    )


def empty_case(case: ReproCase, *, backward: bool = False) -> ReproCase | None:
    """`case` called by its public name on value-less inputs; None when it cannot be (a sparse
    input, whose parts' values are its structure, or an op with no public name). In `backward`
    the op ran under autograd's own no-grad: its inputs do not require grad in the repro."""
    target = public_target(case)
    if target is None:
        return None
    new = replace(case, target=target)
    for path, spec in case.tensors():
        if spec.is_sparse:
            return None
        new = new.with_arg(path, _empty_spec(spec, grad=not backward))
    return new
