"""Where a NaN or inf came from: the op that made it, the ops that carried it, how the run ended.

A Failure recorded with `--nan` (or traced on its own, when a culprit's inputs were non-finite)
carries one NonfiniteOrigin. The rules saying which input values make an op non-finite (log of
a value <= 0, exp above log(max of the dtype), a divisor of exactly 0) live here as plain Python,
so that the facts (report/) and the shrink passes (shrink/) read the same table. Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reprocut.model.case import SourceLocation

# how an origin was found: made from finite inputs, a NaN made from inputs holding only inf,
# or already there when the step began (data, a buffer, a value carried over from before)
BORN = "born"
FROM_INF = "from-inf"
ENTERED = "entered"

FLOAT_MAX = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
}


def exp_limit(dtype: str) -> float:
    """The largest x with a finite exp(x) in `dtype` (11.09 in float16, 88.72 in float32)."""
    return math.log(FLOAT_MAX.get(dtype, FLOAT_MAX["float32"]))


def short_op(op: str) -> str:
    """`exp` for `aten::exp`, `torch.exp`, `torch.Tensor.exp_`, `torch.ops.aten.exp.default`."""
    parts = op.removeprefix("aten::").split(".")
    if parts[:3] == ["torch", "ops", "aten"] and len(parts) >= 4:
        name = parts[3]
    else:
        name = parts[-1] if parts[0] == "torch" else parts[0]
    name = name.removeprefix("__").removesuffix("__")
    name = {"truediv": "div", "itruediv": "div", "true_divide": "div", "rdiv": "div"}.get(
        name, name
    )
    return name.removesuffix("_") if name != "_" else name


Rule = Callable[[float], bool]


def offending(op: str, position: int, dtype: str) -> Rule | None:
    """Which values of argument `position` make `op` return NaN or inf (None: no rule known)."""
    name = short_op(op)
    if position == 0:
        if name in ("log", "log2", "log10"):
            return lambda v: v <= 0
        if name == "log1p":
            return lambda v: v <= -1
        if name == "sqrt":
            return lambda v: v < 0
        if name in ("rsqrt", "reciprocal"):
            return lambda v: v <= 0 if name == "rsqrt" else v == 0
        if name in ("exp", "expm1", "exp2"):
            limit = exp_limit(dtype) / (math.log(2) if name == "exp2" else 1.0)
            return lambda v: v > limit
        if name in ("acos", "asin"):
            return lambda v: abs(v) > 1
        if name == "atanh":
            return lambda v: abs(v) >= 1
    if position == 1 and name in ("div", "remainder", "fmod"):
        return lambda v: v == 0
    return None


@dataclass(frozen=True, slots=True)
class Link:
    """One op that carried the non-finite value on, after its origin."""

    op: str
    kind: str  # "nan" or "inf": what its output held
    step: int
    phase: str
    module: str | None = None
    source: SourceLocation | None = None
    autograd_node: str | None = None

    def describe(self) -> str:
        return f"{self.op} ({'NaN' if self.kind == 'nan' else 'inf'})"

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "kind": self.kind,
            "step": self.step,
            "phase": self.phase,
            "module": self.module,
            "source": location_json(self.source),
            "autograd_node": self.autograd_node,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Link:
        return cls(
            op=data["op"],
            kind=data["kind"],
            step=data["step"],
            phase=data["phase"],
            module=data.get("module"),
            source=location_from_json(data.get("source")),
            autograd_node=data.get("autograd_node"),
        )


@dataclass(frozen=True, slots=True)
class Ended:
    """How the first run ended after the value was born: failed, passed, or stopped by reprocut."""

    how: str  # "failed", "passed", "stopped"
    message: str  # "RuntimeError: probability tensor contains ..." or what happened instead
    step: int | None = None
    op: str | None = None
    source: SourceLocation | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "message": self.message,
            "step": self.step,
            "op": self.op,
            "source": location_json(self.source),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ended:
        return cls(
            how=data["how"],
            message=data["message"],
            step=data.get("step"),
            op=data.get("op"),
            source=location_from_json(data.get("source")),
        )


@dataclass(frozen=True, slots=True)
class NonfiniteOrigin:
    """The first op whose floating outputs held NaN or inf while its inputs were finite."""

    how: str  # BORN, FROM_INF or ENTERED
    op: str
    kind: str  # "nan" or "inf": what the op's output held
    step: int
    phase: str
    module: str | None = None
    source: SourceLocation | None = None
    autograd_node: str | None = None  # backward ops: the node whose backward ran it
    public_call: str | None = None
    facts: tuple[str, ...] = ()
    chain: tuple[Link, ...] = ()
    ended: Ended | None = None
    entered_as: str | None = None  # ENTERED: the input that held it ("running_var", "x")

    def to_json(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "op": self.op,
            "kind": self.kind,
            "step": self.step,
            "phase": self.phase,
            "module": self.module,
            "source": location_json(self.source),
            "autograd_node": self.autograd_node,
            "public_call": self.public_call,
            "facts": list(self.facts),
            "chain": [link.to_json() for link in self.chain],
            "ended": None if self.ended is None else self.ended.to_json(),
            "entered_as": self.entered_as,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NonfiniteOrigin:
        ended = data.get("ended")
        return cls(
            how=data["how"],
            op=data["op"],
            kind=data["kind"],
            step=data["step"],
            phase=data["phase"],
            module=data.get("module"),
            source=location_from_json(data.get("source")),
            autograd_node=data.get("autograd_node"),
            public_call=data.get("public_call"),
            facts=tuple(data.get("facts", ())),
            chain=tuple(Link.from_json(link) for link in data.get("chain", ())),
            ended=None if ended is None else Ended.from_json(ended),
            entered_as=data.get("entered_as"),
        )


def location_json(location: SourceLocation | None) -> dict[str, Any] | None:
    return None if location is None else location.to_json()


def location_from_json(data: dict[str, Any] | None) -> SourceLocation | None:
    return None if data is None else SourceLocation(**data)
