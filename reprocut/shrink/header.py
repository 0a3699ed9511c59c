"""What a repro.py header docstring states, as plain text: the op, the expected signature, the
message and assertion the user saw, whether the data is real, whether CPU reproduces, and the
machine it was seen on. The emitter puts this text into the script; report.md reuses Environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reprocut.model.case import Captured, Literal, ReproCase, Signature
from reprocut.model.signature import is_nonfinite


@dataclass(frozen=True, slots=True)
class Environment:
    """Versions of the machine the failure was seen on; gathered by the caller, never env vars."""

    torch: str = ""
    cuda: str | None = None
    driver: str | None = None
    gpu: str | None = None
    python: str = ""
    os: str = ""

    def lines(self) -> list[str]:
        return [
            f"torch {self.torch or 'unknown'}, CUDA {self.cuda or 'none'}, "
            f"driver {self.driver or 'none'}",
            f"GPU {self.gpu or 'none'}, Python {self.python or 'unknown'}"
            + (f", {self.os}" if self.os else ""),
        ]


@dataclass(frozen=True, slots=True)
class Header:
    """What the header docstring states about the repro."""

    expected: Signature | None = None
    message: str = ""  # the error message the user saw (first line)
    assertion: str = ""  # the kernel's assertion text, if any
    environment: Environment = field(default_factory=Environment)
    cpu_reproduces: bool | None = None  # None: not checked
    cpu_message: str = ""
    float64: str = ""  # a non-finite output: does the same call in float64 stay finite?
    notes: tuple[str, ...] = ()  # sentences after the call (an out-of-memory's why, its phase)


def data_origin(case: ReproCase) -> str:
    """ "real", "synthetic" or "mixed": did the values come from the user's run?"""
    generated = [getattr(leaf.values, "kind", "") for _, spec in case.tensors()
                 for leaf in (spec.parts or (spec,))]  # fmt: skip
    if "empty" in generated and set(generated) <= {"empty", "zeros"}:
        return "none needed (torch.empty of the recorded shapes, strides and dtypes)"
    kinds = {
        isinstance(leaf.values, (Captured, Literal))
        for _, spec in case.tensors()
        for leaf in (spec.parts or (spec,))  # a sparse tensor's data are its parts
    }  # Literal values were inlined from captured data or written by the shrinker
    if kinds == {True}:
        return "real (values captured from the failing run)"
    if kinds == {False} or not kinds:
        return "synthetic (generated tensors)"
    return "mixed: captured values where they matter, generated elsewhere"


def header_text(case: ReproCase, header: Header) -> str:
    expected = header.expected or case.expected
    lines = [f"Minimal reproduction of a failure in {case.aten_op or case.target}."]
    if is_nonfinite(expected) and expected is not None:
        made = expected.kind.rsplit(" ", 1)[-1].replace("nan", "NaN")
        lines = [f"Minimal reproduction: {case.aten_op or case.target} makes {made} (it raises "
                 "nothing: the check at the end does)."]  # fmt: skip
    lines.append("")
    if expected is not None:
        lines.append(f"Expected: {expected.describe()}")
    if header.message:
        lines.append(f"Message: {header.message.strip().splitlines()[0]}")
    if header.assertion:
        lines.append(f"Assertion: {header.assertion}")
    lines.append(f"Call: {case.target}")
    lines.extend(header.notes)
    for name, value in case.env:
        lines.append(f"Environment: {name}={value} (set below: it fails only with it)")
    lines.append(f"Data: {data_origin(case)}")
    if header.cpu_reproduces is None:
        lines.append("CPU: not checked")
    elif header.cpu_reproduces:
        lines.append(f"CPU: reproduces too ({header.cpu_message or 'same signature'})")
    else:
        lines.append(
            "CPU: does not reproduce" + (f" ({header.cpu_message})" if header.cpu_message else "")
        )
    if header.float64:
        lines.append(f"Float64: {header.float64}")
    lines.append("")
    lines.append("Seen on:")
    lines.extend(f"  {line}" for line in header.environment.lines())
    lines.append("")
    lines.append("Run: python repro.py")
    return "\n".join(lines)
