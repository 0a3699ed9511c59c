"""What a repro.py header docstring states, as plain text: the op, the expected signature, the
repro's own message (the original's beside it where they differ), the original's sizes and the
facts that explain them, whether the data is real, whether CPU reproduces, and the machine it
was seen on. The emitter puts this text into the script; report.md reuses Environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from reprocut.model.case import Captured, Literal, ReproCase, Signature, TensorSpec
from reprocut.model.recording import TensorReport
from reprocut.model.signature import is_nonfinite

MESSAGE = "Message: "  # the message the repro prints
ORIGINAL_MESSAGE = "Original's message (the unshrunk program): "
ORIGINAL = "Original: "  # the unshrunk call's sizes and the facts that explain them


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
    # the error message (first line): the user's until plain runs of the repro print its own
    # (restate_message), the user's then beside it as the original's
    message: str = ""
    assertion: str = ""  # the kernel's assertion text, if any
    environment: Environment = field(default_factory=Environment)
    cpu_reproduces: bool | None = None  # None: not checked
    cpu_message: str = ""
    float64: str = ""  # a non-finite output: does the same call in float64 stay finite?
    notes: tuple[str, ...] = ()  # sentences after the call (an out-of-memory's why, its phase)
    original: tuple[OriginalArg, ...] = ()  # the unshrunk call's tensors (original_args)


@dataclass(frozen=True, slots=True)
class OriginalArg:
    """One tensor argument of the unshrunk call: its path in the case (the same in the shrunk
    case, so the repro's variable names it), its shape, and the facts that explained it."""

    path: tuple[Any, ...]
    shape: tuple[int, ...]
    facts: tuple[str, ...] = ()


def original_args(
    case: ReproCase, tensors: tuple[TensorReport, ...], *, facts_per_arg: int = 2
) -> tuple[OriginalArg, ...]:
    """The unshrunk `case`'s tensor arguments, each with the facts that explained the failure
    (the Failure's tensor table, matched by shape, dtype and layout: the table may be the aten
    call's while the case is the public call's, in another order)."""
    unmatched = list(tensors)
    found = []
    for path, spec in case.tensors():  # a list's items too (index_put_'s indices)
        row = next((r for r in unmatched if _same_tensor(r.spec, spec)), None)
        facts: tuple[str, ...] = ()
        if row is not None:
            unmatched.remove(row)
            facts = tuple(f for f in row.facts if not f.startswith("all "))[:facts_per_arg]
        found.append(OriginalArg(path, tuple(spec.shape), facts))
    return tuple(found)


def _same_tensor(a: TensorSpec, b: TensorSpec) -> bool:
    return (tuple(a.shape), a.dtype, a.stride, a.storage_offset) == (
        tuple(b.shape),
        b.dtype,
        b.stride,
        b.storage_offset,
    )


def original_lines(
    case: ReproCase, original: tuple[OriginalArg, ...], names: Mapping[tuple[Any, ...], str]
) -> list[str]:
    """`Original: ids (1, 120), weight (100, 256)` and, below, the facts that explain them
    (`  ids: index max 119 ≥ 100 rows at [0, 94]`), by the repro's own variable names: said
    when the shrink changed a size or a fact explains one, so the numbers that explain the bug
    survive the shrink."""
    shrunk = dict(case.tensors())
    kept = [arg for arg in original if arg.path in names and arg.path in shrunk]
    changed = any(tuple(shrunk[a.path].shape) != a.shape or a.facts for a in kept)
    if not kept or not changed:
        return []
    lines = [ORIGINAL + ", ".join(f"{names[arg.path]} {arg.shape}" for arg in kept)]
    lines += [f"  {names[arg.path]}: {'; '.join(arg.facts)}" for arg in kept if arg.facts]
    return lines


def message_lines(message: str, original: str) -> list[str]:
    """`Message:` (the first line of `message`), and the original's beside it where it differs."""
    first, before = _first_line(message), _first_line(original)
    lines = [MESSAGE + first] if first else []
    if before and before != first:
        lines.append(ORIGINAL_MESSAGE + before)
    return lines


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def restate_message(code: str, message: str, original: str) -> str:
    """`code` with its header's message the repro's own (`message`, as its plain runs printed
    it), the original's beside it where they differ; unchanged without such a header."""
    module = cst.parse_module(code)
    first = module.body[0] if module.body else None
    if not (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, cst.SimpleString)
    ):
        return code
    text = first.body[0].value.evaluated_value
    if not isinstance(text, str):
        return code
    lines = text.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith(MESSAGE)), None)
    if at is None:
        return code
    end = at + 1 + (at + 1 < len(lines) and lines[at + 1].startswith(ORIGINAL_MESSAGE))
    lines[at:end] = message_lines(message, original)
    docstring = first.with_changes(body=[first.body[0].with_changes(value=_string(lines))])
    return module.with_changes(body=[docstring, *module.body[1:]]).code


def _string(lines: list[str]) -> cst.SimpleString:
    body = "\n".join(lines).rstrip("\n")
    return cst.SimpleString(
        '"""' + body.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '\n"""'
    )


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


def header_text(
    case: ReproCase, header: Header, names: Mapping[tuple[Any, ...], str] | None = None
) -> str:
    """The header docstring's text (`names`: the repro's variable of each argument path)."""
    expected = header.expected or case.expected
    lines = [f"Minimal reproduction of a failure in {case.aten_op or case.target}."]
    if is_nonfinite(expected) and expected is not None:
        made = expected.kind.rsplit(" ", 1)[-1].replace("nan", "NaN")
        lines = [f"Minimal reproduction: {case.aten_op or case.target} makes {made} (it raises "
                 "nothing: the check at the end does)."]  # fmt: skip
    lines.append("")
    if expected is not None:
        lines.append(f"Expected: {expected.describe()}")
    lines.extend(message_lines(header.message, ""))
    if header.assertion:
        lines.append(f"Assertion: {header.assertion}")
    lines.append(f"Call: {case.target}")
    if names is not None and header.original:
        lines.extend(original_lines(case, header.original, names))
    lines.extend(header.notes)
    for name, value in case.env:
        lines.append(f"Environment: {name}={value} (set below: it fails only with it)")
    lines.append(f"Data: {data_origin(case)}")
    if header.cpu_reproduces is None:
        lines.append(
            "CPU: not checked" + (f" ({header.cpu_message})" if header.cpu_message else "")
        )
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
