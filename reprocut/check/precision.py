"""Is a non-finite output a matter of precision, or of the values themselves?

Takes a shrunk non-finite case; runs the same call with every floating tensor (and dtype
argument) in float64. If it stays finite there, float16/bfloat16/float32 ran out of range or
precision (exp(26) in float16); if it is non-finite in float64 too, the inputs themselves make it
(log of 0, 0 / 0). The answer goes into the repro's header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from reprocut.check.oracle import Oracle, Passed, Reproduced
from reprocut.model.case import FLOAT_DTYPES, Arg, ArgList, ReproCase, Symbol, TensorSpec

_FLOAT_SYMBOLS = {f"torch.{dtype}" for dtype in FLOAT_DTYPES} | {"torch.half", "torch.float"}


def in_float64(arg: Arg) -> Arg:
    if isinstance(arg, TensorSpec) and arg.dtype in FLOAT_DTYPES:
        return replace(arg, dtype="float64")
    if isinstance(arg, Symbol) and arg.path in _FLOAT_SYMBOLS:
        return Symbol("torch.float64")
    if isinstance(arg, ArgList):
        return ArgList(tuple(in_float64(item) for item in arg.items))
    return arg


def as_float64(case: ReproCase) -> ReproCase:
    return replace(
        case,
        args=tuple(in_float64(a) for a in case.args),
        kwargs=tuple((k, in_float64(v)) for k, v in case.kwargs),
    )


def float64_behaviour(case: ReproCase, inputs: Mapping[str, Any], oracle: Oracle) -> str:
    """One line for the header: what the same call does in float64."""
    dtypes = sorted({s.dtype for _, s in case.tensors() if s.dtype in FLOAT_DTYPES} - {"float64"})
    if not dtypes:
        return "the inputs are float64 already: the values themselves make it"
    verdict = oracle.check_case(as_float64(case), inputs, expected=case.expected)
    held = "/".join(dtypes)
    if isinstance(verdict, Passed):
        return f"stays finite: a precision problem ({held} cannot hold the result)"
    if isinstance(verdict, Reproduced):
        return f"non-finite too: the values themselves make it, not {held}"
    return f"not known (float64 run: {type(verdict).__name__})"
