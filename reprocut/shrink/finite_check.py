"""The end of a non-finite repro: raise when the call's floating outputs hold NaN or inf.

A NaN is no exception, so the repro of an op that made one raises its own:
`FloatingPointError: non-finite output: nan` (or `inf`), the signature
`model.signature.nonfinite_signature` defines, which a plain `python repro.py` shows on stderr
like any other failure. An in-place op is checked through the tensor it wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import libcst as cst
from libcst.helpers import parse_template_statement

from reprocut.model.case import ReproCase
from reprocut.model.signature import NONFINITE_ERROR, NONFINITE_MESSAGE
from reprocut.shrink.call_code import _arg_expression, variable_name
from reprocut.shrink.nodes import assign, literal

_OUTPUTS = "{outputs} = {out} if isinstance({out}, (tuple, list)) else ({out},)"
_CHECK = "if any(o.{test}().any() for o in {outputs}):\n    raise {error}({message})\n"


def writes_first_argument(case: ReproCase) -> bool:
    """`torch.Tensor.div_`, `torch.ops.aten._foreach_add_.List`: the result is the first arg."""
    parts = case.target.split(".")
    name = parts[3] if parts[:3] == ["torch", "ops", "aten"] and len(parts) > 3 else parts[-1]
    return name.endswith("_") and not name.endswith("__")


def finite_check(
    case: ReproCase,
    call_line: cst.SimpleStatementLine,
    names: Mapping[tuple[Any, ...], str],
    taken: set[str],
) -> tuple[cst.SimpleStatementLine, list[cst.BaseStatement]]:
    """The call bound to `out` (or left alone, for in-place ops), and the checks after it."""
    expression = call_line.body[0]
    if not isinstance(expression, cst.Expr):
        return call_line, []
    outputs = cst.Name(variable_name("outputs", 0, taken))
    if writes_first_argument(case) and case.args:
        checked: cst.BaseExpression = _arg_expression(case.args[0], ("args", 0), names)
        line = call_line
    else:
        checked = cst.Name(variable_name("out", 0, taken))
        line = assign(checked, expression.value)
    checks: list[cst.BaseStatement] = [
        parse_template_statement(_OUTPUTS, outputs=outputs, out=checked)
    ]
    for test, kind in (("isnan", "nan"), ("isinf", "inf")):
        checks.append(
            parse_template_statement(
                _CHECK,
                test=cst.Name(test),
                outputs=outputs,
                error=cst.Name(NONFINITE_ERROR),
                message=literal(NONFINITE_MESSAGE.format(kind=kind)),
            )
        )
    return line, checks
