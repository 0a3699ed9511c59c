"""ReproCase -> repro.py text, built as a libcst tree (no value is ever pasted into source text).

The emitted script imports only torch, builds each tensor argument from literals or generators,
makes the one failing call, and ends with a synchronize when a tensor lives on CUDA so the error
surfaces inside the script. A header docstring says what it reproduces and where.
This module assembles the script; the header text, each tensor's statements and the call
come from header.py, tensor_code.py and call_code.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import libcst as cst
from libcst.helpers import parse_template_module

from reprocut.model.case import (
    INT_DTYPES,
    RANDOM_KINDS,
    Captured,
    Generated,
    Literal,
    ReproCase,
    TensorSpec,
)
from reprocut.shrink.call_code import INDEX_NAMES, call_statement, parameter_names, variable_name
from reprocut.shrink.finite_check import finite_check
from reprocut.shrink.header import Header, header_text
from reprocut.shrink.nodes import assign, call, literal
from reprocut.shrink.tensor_code import tensor_statements

INLINE_LIMIT = 256  # captured tensors up to this many elements are written into the script
SIDECAR_NAME = "repro_inputs.pt"

TEMPLATE = """\
import torch


def main():
    pass


if __name__ == "__main__":
    main()
"""

SIDECAR_TEMPLATE = """\
import pathlib

import torch


def main():
    pass


if __name__ == "__main__":
    main()
"""


@dataclass(frozen=True, slots=True)
class Emitted:
    """An emitted script: its text, how many statements main() has, and captured keys it loads."""

    code: str
    statements: int
    sidecar_keys: tuple[str, ...] = ()


def _docstring(text: str) -> cst.SimpleStatementLine:
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return cst.SimpleStatementLine(body=[cst.Expr(cst.SimpleString(f'"""{body}\n"""'))])


def inline_captured(
    case: ReproCase, inputs: Mapping[str, Any], limit: int = INLINE_LIMIT
) -> ReproCase:
    """Captured values small enough to read become Literals; larger ones stay for the sidecar."""
    new = case
    for path, spec in case.tensors():
        inlined = _inlined(spec, inputs, limit)
        if inlined != spec:
            new = new.with_arg(path, inlined)
    return new


def _inlined(spec: TensorSpec, inputs: Mapping[str, Any], limit: int) -> TensorSpec:
    if spec.is_sparse:  # its parts are inlined one by one
        return replace(spec, parts=tuple(_inlined(part, inputs, limit) for part in spec.parts))
    if isinstance(spec.values, Captured) and spec.values.key in inputs and spec.numel <= limit:
        flat = inputs[spec.values.key].detach().cpu().reshape(-1).tolist()
        return replace(spec, values=Literal(tuple(flat[: spec.numel])))
    return spec


def leaf_specs(case: ReproCase) -> list[TensorSpec]:
    """Every tensor the repro builds: each argument, and a sparse argument's parts."""
    return [leaf for _, spec in case.tensors() for leaf in (spec, *spec.parts)]


def emit(case: ReproCase, header: Header | None = None) -> Emitted:
    """The repro.py text for `case` (Captured values are loaded from repro_inputs.pt beside it)."""
    header = header or Header(expected=case.expected)
    positional = parameter_names(case)
    taken: set[str] = set()
    names: dict[tuple[Any, ...], str] = {}
    body: list[cst.BaseStatement] = []
    sidecar: list[str] = []
    specs = list(case.tensors())
    leaves = [leaf for leaf in leaf_specs(case) if not leaf.is_sparse]
    if any(isinstance(s.values, Generated) and s.values.kind in RANDOM_KINDS for s in leaves):
        body.append(cst.SimpleStatementLine([cst.Expr(call("torch.manual_seed", literal(0)))]))
    if any(isinstance(s.values, Captured) for s in leaves):
        here = call("pathlib.Path", cst.Name("__file__"))
        location = call(cst.Attribute(here, cst.Name("with_name")), literal(SIDECAR_NAME))
        body.append(
            assign(cst.Name("inputs"), call("torch.load", location, weights_only=cst.Name("True")))
        )
    for path, spec in specs:
        if path[0] == "args":
            preferred = positional[path[1]] if path[1] < len(positional) else None
        else:
            preferred = path[1]
        if len(path) > 2:
            preferred = f"{preferred or 't'}{path[-1]}"
        if spec.dtype in INT_DTYPES and preferred in INDEX_NAMES:
            preferred = INDEX_NAMES[preferred]
        names[path] = variable_name(preferred, len(names), taken)
        for leaf in (spec, *spec.parts):
            if isinstance(leaf.values, Captured) and not leaf.is_sparse:
                sidecar.append(leaf.values.key)
        body.extend(tensor_statements(names[path], spec))
    call_line, checks = call_statement(case, names), []
    if case.check_finite:  # a NaN raises nothing: the repro checks the output itself
        call_line, checks = finite_check(case, call_line, names, taken)
    body.append(call_line)
    if any(spec.device.startswith("cuda") for _, spec in specs):
        body.append(cst.SimpleStatementLine([cst.Expr(call("torch.cuda.synchronize"))]))
    body.extend(checks)
    template = SIDECAR_TEMPLATE if sidecar else TEMPLATE
    module = parse_template_module(template)
    module = module.visit(_FillMain(body))
    environment = _environment_lines(case)
    top = list(module.body)
    if case.definitions:  # the custom op's own code, between the imports and main()
        present = {cst.Module([]).code_for_node(node) for node in top}
        defined = [
            node
            for node in cst.parse_module(case.definitions).body
            if cst.Module([]).code_for_node(node) not in present  # `import torch` once
        ]
        top = [
            *top[:-2],
            *defined,
            top[-2].with_changes(leading_lines=[cst.EmptyLine()] * 2),
            top[-1],
        ]
    if environment:  # a blank line between the environment and the imports
        top = [*environment, top[0].with_changes(leading_lines=[cst.EmptyLine()]), *top[1:]]
    first = top[0].with_changes(leading_lines=[cst.EmptyLine()])
    docstring = _docstring(header_text(case, header, names))
    module = module.with_changes(body=[docstring, first, *top[1:]])
    return Emitted(
        code=module.code, statements=len(body), sidecar_keys=tuple(dict.fromkeys(sidecar))
    )


def _environment_lines(case: ReproCase) -> list[cst.BaseStatement]:
    """`import os` and `os.environ.setdefault(name, value)` for each variable the failure needs,
    before torch is imported (CUDA reads them when it starts)."""
    if not case.env:
        return []
    lines: list[cst.BaseStatement] = [cst.parse_statement("import os\n")]
    for name, value in case.env:
        setdefault = call("os.environ.setdefault", literal(name), literal(value))
        lines.append(cst.SimpleStatementLine([cst.Expr(setdefault)]))
    return lines


class _FillMain(cst.CSTTransformer):
    """Replaces the `pass` body of main() in the template with the repro's statements."""

    def __init__(self, body: list[cst.BaseStatement]) -> None:
        super().__init__()
        self.body = body

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        if original_node.name.value != "main":
            return updated_node
        return updated_node.with_changes(body=cst.IndentedBlock(body=self.body))


def count_statements(code: str) -> int:
    """Statements in main() of an emitted or reduced script (0 when it has no main)."""
    module = cst.parse_module(code)
    for node in module.body:
        if isinstance(node, cst.FunctionDef) and node.name.value == "main":
            return sum(
                len(s.body) if isinstance(s, cst.SimpleStatementLine) else 1 for s in node.body.body
            )  # type: ignore[union-attr]
    return 0


__all__ = [
    "INLINE_LIMIT",
    "SIDECAR_NAME",
    "Emitted",
    "count_statements",
    "emit",
    "inline_captured",
]
