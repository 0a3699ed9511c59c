"""Facts that explain a non-finite origin, from the op's real inputs: "std has an exact 0 at
[7, 0]", "var + eps min -0.0039", "float16 scores max 26.0: exp overflows above 11.09".

Inputs are named as the user's line names them (the operand of `/`, the argument of `.sqrt()`)
where the line says, else by the op's parameter names. The rules which values break which op
are model.nonfinite's, shared with the shrink passes.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any

import torch

from reprocut.model.nonfinite import FLOAT_MAX, exp_limit, offending, short_op
from reprocut.report.diagnosis import _where

_BINARY = {ast.Div: "div", ast.Pow: "pow", ast.Mult: "mul", ast.Sub: "sub", ast.Add: "add",
           ast.MatMult: "matmul", ast.Mod: "remainder", ast.FloorDiv: "floor_divide"}  # fmt: skip
_ALIASES = {"true_divide": "div", "mm": "matmul", "bmm": "matmul", "addmm": "matmul"}
DIAGNOSES = {
    "log": (
        "log of 0 is -inf, of a negative value NaN. Usual causes: a probability that underflowed "
        "to exactly 0 (take log_softmax of the logits instead of log(softmax)), a count or "
        "price of 0 in the data, or a missing clamp(min=eps)."
    ),
    "div": (
        "A division by exactly 0: x / 0 is inf, 0 / 0 is NaN. Usual causes: a standard "
        "deviation or norm of a constant (or all-zero) row, a mask that selects nothing, a "
        "temperature or count that reached 0. Add an epsilon or clamp the divisor."
    ),
    "sqrt": (
        "sqrt of a negative value is NaN (and its gradient at 0 is inf). Usual causes: a "
        "variance computed as E[x²] - E[x]², which rounding makes slightly negative, or a "
        "distance of a vector to itself in backward. Clamp to 0 first, or use torch.var."
    ),
    "exp": (
        "exp overflows to inf above log(max) of the dtype (11.09 in float16, 88.72 in float32); "
        "inf / inf is then NaN. Usual causes: a softmax written by hand without subtracting the "
        "row max, unscaled attention scores in float16, a log-rate that grew. Use "
        "torch.softmax / logsumexp, or compute in float32."
    ),
    "overflow": (
        "Finite inputs gave a result too large for the dtype. In float16 (max 65504) a dot "
        "product or sum of moderate values overflows; compute in float32 (autocast keeps "
        "reductions there) or scale the inputs down."
    ),
    "from-inf": (
        "The NaN was made from inf: inf - inf, inf / inf, 0 * inf, or a softmax over a row that "
        "is all -inf (every position masked). Make sure each row keeps one unmasked position, "
        "or use a large negative value instead of -inf."
    ),
    "entered": (
        "No op made this value: it was already in an input when the step began: the data, a "
        "buffer or a parameter carried over from before. Check the data for NaN (x.isnan().any()) "
        "and where that tensor was last written."
    ),
}


def family(op: str, how: str) -> str:
    if how in ("from-inf", "entered"):
        return how
    name = _ALIASES.get(short_op(op), short_op(op))
    if name in ("log", "log2", "log10", "log1p", "xlogy"):
        return "log"
    if name in ("div", "reciprocal", "remainder", "fmod"):
        return "div"
    if name in ("sqrt", "rsqrt"):
        return "sqrt"
    if name in ("exp", "expm1", "exp2", "softmax", "_softmax"):
        return "exp"
    return "overflow"


def argument_texts(line: str, op: str) -> list[str]:
    """How the user's line spells the op's operands: ["x - mean", "std"] for
    `z = (x - mean) / std` and div; [] when the line does not say."""
    name = _ALIASES.get(short_op(op), short_op(op))
    try:
        tree = ast.parse(line.strip().rstrip(":").removeprefix("return "))
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and _BINARY.get(type(node.op)) == name:
            return [ast.unparse(node.left), ast.unparse(node.right)]
        if isinstance(node, ast.AugAssign) and _BINARY.get(type(node.op)) == name:
            return [ast.unparse(node.target), ast.unparse(node.value)]
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            called = _ALIASES.get(called.removesuffix("_"), called.removesuffix("_"))
            if called != name:
                continue
            args = [ast.unparse(a) for a in node.args]
            owner = func.value if isinstance(func, ast.Attribute) else None
            if owner is not None and not (isinstance(owner, ast.Name) and owner.id == "torch"):
                return [ast.unparse(owner), *args]  # x.sqrt(): the tensor is the first operand
            return args
    return []


def label_of(position: int | str, names: Sequence[str], texts: Sequence[str]) -> str:
    if isinstance(position, int) and position < len(texts):
        return texts[position]
    if isinstance(position, int) and position < len(names):
        return names[position]
    return str(position)


def nonfinite_facts(
    op: str,
    how: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    names: Sequence[str] = (),
    line: str = "",
) -> tuple[dict[int | str, tuple[str, ...]], tuple[str, ...]]:
    """Facts per argument (position or kwarg name), and the whole list as the report says it."""
    texts = argument_texts(line, op) if line else []
    facts: dict[int | str, tuple[str, ...]] = {}
    everything: list[str] = []
    floats = [(i, a) for i, a in [*enumerate(args), *kwargs.items()] if _is_float(a)]
    for position, value in floats:
        label = label_of(position, names, texts)
        found = _argument_facts(op, how, position, value, label, floats)
        if found:
            facts[position] = found
            everything.extend(found)
    if not everything and how == "born":
        everything.extend(_overflow_facts(floats, names, texts))
    return facts, tuple(everything)


def _is_float(value: Any) -> bool:
    return (isinstance(value, torch.Tensor) and value.is_floating_point()) or isinstance(
        value, float
    )


def _argument_facts(
    op: str,
    how: str,
    position: int | str,
    value: Any,
    label: str,
    floats: list[tuple[int | str, Any]],
) -> tuple[str, ...]:
    if isinstance(value, float):
        if not math.isfinite(value):
            return (f"{label} is {value}",)
        if value == 0 and offending(op, position if isinstance(position, int) else -1, "float64"):
            return (f"{label} is {value}",)
        return ()
    data = value.detach().to("cpu")
    if not data.numel():
        return ()
    dtype = str(value.dtype).removeprefix("torch.")
    wide = data.to(torch.float64)
    if how in ("from-inf", "entered"):
        return _nonfinite_values(data, wide, label)
    rule = offending(op, position if isinstance(position, int) else -1, dtype)
    if rule is None:
        return ()
    name = short_op(op)
    flat = wide.reshape(-1)
    if name in ("exp", "expm1", "exp2"):
        top = float(flat.max())
        at = _where(data, int(flat.argmax()))
        limit = exp_limit(dtype)
        return (f"{dtype} {label} max {top:.4g} at {at}: exp overflows above {limit:.4g}",)
    zeros = flat == 0
    if name in ("div", "log", "log2", "log10", "rsqrt", "reciprocal", "remainder", "fmod") and bool(
        zeros.any()
    ):
        first = int(torch.nonzero(zeros)[0])
        count = int(zeros.sum())
        more = f" ({count} zeros)" if count > 1 else ""
        where = "is exactly 0" if data.dim() == 0 else f"has an exact 0 at {_where(data, first)}"
        found = [f"{label} {where}{more}"]
        if name == "div" and isinstance(position, int) and position == 1:
            found.extend(_zero_over_zero(floats, data))
        return tuple(found)
    bad = torch.tensor([rule(float(v)) for v in flat.tolist()]) if flat.numel() < 1 << 20 else None
    if bad is not None and bool(bad.any()):
        low = float(flat.min())
        at = _where(data, int(flat.argmin()))
        count = int(bad.sum())
        return (f"{label} min {low:.4g} at {at} ({count} of {flat.numel()} values outside the "
                "domain)" if count > 1 else f"{label} min {low:.4g} at {at}",)  # fmt: skip
    return ()


def _zero_over_zero(floats: list[tuple[int | str, Any]], divisor: torch.Tensor) -> list[str]:
    """Where the numerator is 0 as well as the divisor, the result is NaN, not inf."""
    numerator = dict(floats).get(0)
    if not isinstance(numerator, torch.Tensor):
        return []
    try:
        both = torch.broadcast_tensors(numerator.detach().cpu(), divisor)
    except RuntimeError:
        return []
    zero = (both[0] == 0) & (both[1] == 0)
    if not bool(zero.any()):
        return []
    return [f"0 / 0 at {_where(zero, int(torch.nonzero(zero.reshape(-1))[0]))}: NaN"]


def _nonfinite_values(data: torch.Tensor, wide: torch.Tensor, label: str) -> tuple[str, ...]:
    flat = wide.reshape(-1)
    nan, inf = torch.isnan(flat), torch.isinf(flat)
    found = []
    if bool(nan.any()):
        found.append(f"{label} holds {int(nan.sum())} NaN (first at "
                     f"{_where(data, int(torch.nonzero(nan)[0]))})")  # fmt: skip
    if bool(inf.any()):
        found.append(f"{label} holds {int(inf.sum())} inf (first at "
                     f"{_where(data, int(torch.nonzero(inf)[0]))})")  # fmt: skip
        if data.dim() >= 1 and data.shape[-1] > 1:
            rows = torch.isinf(wide).reshape(-1, data.shape[-1]).all(-1)
            if bool(rows.any()):
                first = int(torch.nonzero(rows)[0])
                found.append(f"{label}: {int(rows.sum())} row(s) all inf (first row {first})")
    return tuple(found)


def _overflow_facts(
    floats: list[tuple[int | str, Any]], names: Sequence[str], texts: Sequence[str]
) -> list[str]:
    """No domain rule: say how large the inputs are next to what the dtype holds."""
    found = []
    for position, value in floats:
        if not isinstance(value, torch.Tensor) or not value.numel():
            continue
        dtype = str(value.dtype).removeprefix("torch.")
        top = float(value.detach().to("cpu", torch.float64).abs().max())
        limit = FLOAT_MAX.get(dtype)
        holds = f" ({dtype} holds ±{limit:.5g})" if limit else ""
        found.append(f"{label_of(position, names, texts)} max |x| {top:.4g}{holds}")
    return found
