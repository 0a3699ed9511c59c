"""Small libcst node builders: Python values, dotted names, calls and assignments as nodes.

Every part of the emitter builds source from these, so no value is ever pasted into source text.
"""

from __future__ import annotations

import math
from typing import Any

import libcst as cst

from reprocut.model.errors import EmitError


def attribute_path(path: str) -> cst.BaseExpression:
    """`torch.nn.functional.embedding` as an Attribute chain."""
    parts = path.split(".")
    if not all(part.isidentifier() for part in parts):
        raise EmitError(f"not a dotted name: {path!r}")
    node: cst.BaseExpression = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def call(func: str | cst.BaseExpression, *args: cst.BaseExpression, **kwargs: Any) -> cst.Call:
    callee = attribute_path(func) if isinstance(func, str) else func
    arguments = [cst.Arg(value=arg) for arg in args]
    arguments += [keyword(name, value) for name, value in kwargs.items()]
    return cst.Call(func=callee, args=arguments)


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    tight = cst.SimpleWhitespace("")
    equal = cst.AssignEqual(whitespace_before=tight, whitespace_after=tight)
    return cst.Arg(keyword=cst.Name(name), value=value, equal=equal)


def literal(value: Any) -> cst.BaseExpression:
    """A Python scalar, tuple or list as an expression; NaN and infinities as float("nan")."""
    if value is None or isinstance(value, bool):
        return cst.Name(repr(value))
    if isinstance(value, int):
        if value < 0:
            return cst.UnaryOperation(operator=cst.Minus(), expression=literal(-value))
        return cst.Integer(str(value))
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            text = "nan" if math.isnan(value) else "inf"
            node: cst.BaseExpression = call("float", cst.SimpleString(f'"{text}"'))
            if value < 0:
                return cst.UnaryOperation(operator=cst.Minus(), expression=node)
            return node
        if value < 0 or (value == 0 and math.copysign(1, value) < 0):
            return cst.UnaryOperation(operator=cst.Minus(), expression=literal(-value))
        return cst.Float(repr(value))
    if isinstance(value, str):
        return cst.SimpleString(_quote(value))
    if isinstance(value, tuple):
        elements = [cst.Element(literal(v)) for v in value]
        if len(elements) == 1:
            return cst.Tuple(elements=[cst.Element(literal(value[0]), comma=cst.Comma())])
        return cst.Tuple(elements=elements)
    if isinstance(value, list):
        return cst.List(elements=[cst.Element(literal(v)) for v in value])
    raise EmitError(f"no literal for {type(value).__name__}")


def _quote(text: str) -> str:
    quoted = repr(text)
    if quoted.startswith("'") and '"' not in text:
        quoted = '"' + quoted[1:-1].replace("\\'", "'") + '"'
    return quoted


def assign(
    target: cst.BaseAssignTargetExpression, value: cst.BaseExpression
) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Assign(targets=[cst.AssignTarget(target)], value=value)])
