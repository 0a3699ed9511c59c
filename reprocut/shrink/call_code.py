"""The failing call of a ReproCase: names for its tensor variables and the call statement.

`parameter_names` reads the target's Python signature (else its aten schema) so the script says
`ids` and `weight` rather than `t0`, `t1`; `variable_name` keeps each name a valid, unused
identifier. `call_statement` writes the call as a function, a method, or `a[b]`.
"""

from __future__ import annotations

import builtins
import keyword
from collections.abc import Mapping
from typing import Any

import libcst as cst

from reprocut.model.case import Arg, ArgList, ReproCase, Symbol, TensorSpec
from reprocut.model.errors import EmitError
from reprocut.shrink.nodes import assign, attribute_path, call, literal

_RENAMES = {"self": "x", "input": "x", "indices": "ids"}
INDEX_NAMES = {"self": "ids", "input": "ids"}  # an integer first argument is a set of indices


def parameter_names(case: ReproCase) -> list[str]:
    """Names for positional arguments: from the Python signature, else the aten schema."""
    names: list[str] = []
    try:
        import inspect

        from reprocut.model.tensors import resolve

        func = resolve(case.target)
        parameters = list(inspect.signature(func).parameters.values())
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            raise ValueError("no named parameters")  # OpOverload(*args, **kwargs)
        names = [p.name for p in parameters]
    except (ValueError, TypeError, AttributeError, ImportError):
        names = _schema_names(case)
    if case.target.startswith("torch.Tensor.") and names[:1] != ["self"]:
        names = ["self", *names] if names and names[0] != "self" else names
    return names


def _schema_names(case: ReproCase) -> list[str]:
    try:
        import torch

        name = case.target.rsplit(".", 1)[-1]
        if case.target.startswith("torch.ops.aten."):
            packet = getattr(torch.ops.aten, case.target.split(".")[3])
            overload = getattr(packet, case.target.split(".")[4])
            return [a.name for a in overload._schema.arguments]
        packet = getattr(torch.ops.aten, name, None)
        if packet is None and case.aten_op:
            packet = getattr(torch.ops.aten, case.aten_op.split("::")[-1], None)
        if packet is None:
            return []
        for overload_name in packet.overloads():
            arguments = getattr(packet, overload_name)._schema.arguments
            if len(arguments) >= len(case.args):
                return [a.name for a in arguments]
    except (AttributeError, ImportError, IndexError):
        pass
    return []


def variable_name(preferred: str | None, index: int, taken: set[str]) -> str:
    name = _RENAMES.get(preferred or "", preferred or "") or f"t{index}"
    if not name.isidentifier() or keyword.iskeyword(name) or hasattr(builtins, name) or name in (
        "torch", "main", "inputs", "pathlib",
    ):  # fmt: skip
        name = f"{name}_"
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    taken.add(name)
    return name


def _arg_expression(
    arg: Arg, path: tuple[Any, ...], names: Mapping[tuple[Any, ...], str]
) -> cst.BaseExpression:
    if isinstance(arg, TensorSpec):
        return cst.Name(names[path])
    if isinstance(arg, ArgList):
        return cst.List(
            elements=[
                cst.Element(_arg_expression(item, (*path, i), names))
                for i, item in enumerate(arg.items)
            ]
        )
    if isinstance(arg, Symbol):
        return attribute_path(arg.path)
    return literal(arg)


def call_statement(
    case: ReproCase, names: Mapping[tuple[Any, ...], str]
) -> cst.SimpleStatementLine:
    """The failing call: a function, a method on the first argument, or `a[b]`."""
    args = [_arg_expression(arg, ("args", i), names) for i, arg in enumerate(case.args)]
    kwargs = {name: _arg_expression(arg, ("kwargs", name), names) for name, arg in case.kwargs}
    if case.target in ("torch.Tensor.__getitem__", "torch.Tensor.__setitem__"):
        if len(args) < 2:
            raise EmitError(f"{case.target} needs a tensor and an index")
        index = case.args[1]
        if isinstance(index, ArgList):
            elements = [cst.SubscriptElement(cst.Index(e.value)) for e in args[1].elements]  # type: ignore[attr-defined]
        else:
            elements = [cst.SubscriptElement(cst.Index(args[1]))]
        subscript = cst.Subscript(value=args[0], slice=elements)
        if case.target.endswith("__setitem__"):
            if len(args) != 3:
                raise EmitError("__setitem__ needs a tensor, an index and a value")
            return assign(subscript, args[2])
        return cst.SimpleStatementLine([cst.Expr(subscript)])
    if case.target.startswith("torch.Tensor."):
        if not args:
            raise EmitError(f"method {case.target} needs its tensor as the first argument")
        method = cst.Attribute(value=args[0], attr=cst.Name(case.target.rsplit(".", 1)[-1]))
        return cst.SimpleStatementLine([cst.Expr(call(method, *args[1:], **kwargs))])
    return cst.SimpleStatementLine([cst.Expr(call(case.target, *args, **kwargs))])
