"""ReproCase -> repro.py text, built as a libcst tree (no value is ever pasted into source text).

The emitted script imports only torch, builds each tensor argument from literals or generators,
makes the one failing call, and ends with a synchronize when a tensor lives on CUDA so the error
surfaces inside the script. A header docstring says what it reproduces and where.
"""

from __future__ import annotations

import builtins
import keyword
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import libcst as cst
from libcst.helpers import parse_template_module

from reprocut.model.case import (
    FLOAT_DTYPES,
    INT_DTYPES,
    Arg,
    ArgList,
    Captured,
    Generated,
    Literal,
    ReproCase,
    Signature,
    Symbol,
    TensorSpec,
)
from reprocut.model.errors import EmitError

INLINE_LIMIT = 256  # captured tensors up to this many elements are written into the script
SIDECAR_NAME = "repro_inputs.pt"
RANDOM_KINDS = frozenset({"randn", "rand", "randint"})

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


@dataclass(frozen=True, slots=True)
class Emitted:
    """An emitted script: its text, how many statements main() has, and captured keys it loads."""

    code: str
    statements: int
    sidecar_keys: tuple[str, ...] = ()


# --- small node builders ---------------------------------------------------------------------


def attribute_path(path: str) -> cst.BaseExpression:
    """`torch.nn.functional.embedding` as an Attribute chain."""
    parts = path.split(".")
    if not all(part.isidentifier() for part in parts):
        raise EmitError(f"not a dotted name: {path!r}")
    node: cst.BaseExpression = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _call(func: str | cst.BaseExpression, *args: cst.BaseExpression, **kwargs: Any) -> cst.Call:
    callee = attribute_path(func) if isinstance(func, str) else func
    arguments = [cst.Arg(value=arg) for arg in args]
    arguments += [_keyword(name, value) for name, value in kwargs.items()]
    return cst.Call(func=callee, args=arguments)


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
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
            node: cst.BaseExpression = _call("float", cst.SimpleString(f'"{text}"'))
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


def _docstring(text: str) -> cst.SimpleStatementLine:
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return cst.SimpleStatementLine(body=[cst.Expr(cst.SimpleString(f'"""{body}\n"""'))])


def _shape(shape: tuple[int, ...]) -> cst.BaseExpression:
    return literal(tuple(shape))


def _nested(values: Sequence[Any], shape: tuple[int, ...]) -> Any:
    """Flat row-major values as nested lists of `shape` (so no reshape is needed)."""
    if not shape:
        return values[0]
    if len(shape) == 1:
        return list(values[: shape[0]])
    step = math.prod(shape[1:])
    return [_nested(values[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


# --- tensors ---------------------------------------------------------------------------------


def _default_dtype(values: Sequence[Any]) -> str:
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int) for v in values):
        return "int64"
    return "float32"


def _tensor_kwargs(spec: TensorSpec, *, implied: str | None) -> dict[str, cst.BaseExpression]:
    kwargs: dict[str, cst.BaseExpression] = {}
    if spec.dtype != implied:
        kwargs["dtype"] = attribute_path(f"torch.{spec.dtype}")
    if spec.device != "cpu":
        kwargs["device"] = literal(spec.device)
    return kwargs


def _generator_call(values: Generated, shape: tuple[int, ...], spec: TensorSpec) -> cst.Call:
    kind = values.kind
    is_float = spec.dtype in FLOAT_DTYPES or spec.dtype.startswith("complex")
    if kind in ("randn", "rand") and not is_float:
        kind = "zeros"  # as tensors.generate does: no random normal integers
    kwargs = _tensor_kwargs(spec, implied="float32" if kind != "arange" else "int64")
    if kind in ("randn", "rand", "zeros", "ones"):
        return _call(f"torch.{kind}", *(literal(s) for s in shape), **kwargs)
    if kind == "full":  # the fill value's type would pick the dtype: always name it
        kwargs = _tensor_kwargs(spec, implied=None)
        return _call("torch.full", _shape(shape), literal(values.low), **kwargs)
    if kind == "randint":
        kwargs = _tensor_kwargs(spec, implied="int64")
        return _call(
            "torch.randint", literal(int(values.low)), literal(int(values.high)), _shape(shape),
            **kwargs,
        )  # fmt: skip
    if kind == "arange":
        return _call(
            cst.Attribute(_call("torch.arange", literal(math.prod(shape)), **kwargs), cst.Name("reshape")),
            _shape(shape),
        )  # fmt: skip
    raise EmitError(f"unknown generator {values.kind!r}")


def _literal_tensor(values: Sequence[Any], spec: TensorSpec, shape: tuple[int, ...]) -> cst.Call:
    flat = list(values)
    if len(flat) < math.prod(shape):
        raise EmitError(f"literal has {len(flat)} values for shape {shape}")
    data = _nested(flat, shape)
    if not shape or math.prod(shape) > 0:
        return _call(
            "torch.tensor", literal(data), **_tensor_kwargs(spec, implied=_default_dtype(flat))
        )
    kwargs = _tensor_kwargs(spec, implied="float32")
    return _call("torch.empty", *(literal(s) for s in shape), **kwargs)


def _with_grad(call: cst.Call, spec: TensorSpec) -> cst.Call:
    if spec.requires_grad and spec.dtype in FLOAT_DTYPES:
        return call.with_changes(args=[*call.args, _keyword("requires_grad", cst.Name("True"))])
    return call


def tensor_statements(name: str, spec: TensorSpec) -> list[cst.BaseStatement]:
    """Statements that bind `name` to the tensor `spec` describes (Captured must be sidecar'd)."""
    target = cst.Name(name)
    plain = spec.is_contiguous and spec.storage_offset == 0
    values = spec.values
    if isinstance(values, Captured):
        loaded = cst.Subscript(
            value=cst.Name("inputs"),
            slice=[cst.SubscriptElement(cst.Index(literal(values.key)))],
        )
        value: cst.BaseExpression = _call(
            cst.Attribute(loaded, cst.Name("to")), **_tensor_kwargs(spec, implied=None)
        )
        if plain:
            return [_assign(target, value)]
        fill = value
    elif isinstance(values, Literal):
        if plain:
            return [
                _assign(target, _with_grad(_literal_tensor(values.values, spec, spec.shape), spec))
            ]
        fill = _literal_tensor(values.values, spec, spec.shape)
    else:
        if plain:
            return [_assign(target, _with_grad(_generator_call(values, spec.shape, spec), spec))]
        storage = _generator_call(values, (spec.storage_numel,), spec)
        return [_assign(target, _as_strided(storage, spec))]
    # a view with a stride or offset that matters: zeros storage, then the real values copied in
    storage = _call(
        "torch.zeros", literal(spec.storage_numel), **_tensor_kwargs(spec, implied="float32")
    )
    if _overlaps(spec):
        return _overlapping_view(name, storage, fill, spec)
    copy = _call(cst.Attribute(target, cst.Name("copy_")), fill)
    return [_assign(target, _as_strided(storage, spec)), cst.SimpleStatementLine([cst.Expr(copy)])]


def _overlaps(spec: TensorSpec) -> bool:
    """Elements share storage (an expand()ed stride 0): copying into such a view is refused."""
    stride = spec.stride or ()
    return any(step == 0 and size > 1 for size, step in zip(spec.shape, stride, strict=False))


def _overlapping_view(
    name: str, storage: cst.BaseExpression, fill: cst.BaseExpression, spec: TensorSpec
) -> list[cst.BaseStatement]:
    """`x_storage[positions] = values` writes each storage element once, then the view."""
    storage_name = cst.Name(f"{name}_storage")
    positions = _as_strided(_call("torch.arange", literal(spec.storage_numel)), spec)
    index = _call(cst.Attribute(positions, cst.Name("reshape")), literal(-1))
    flat = _call(cst.Attribute(fill, cst.Name("reshape")), literal(-1))
    scatter = cst.Subscript(value=storage_name, slice=[cst.SubscriptElement(cst.Index(index))])
    return [
        _assign(storage_name, storage),
        _assign(scatter, flat),
        _assign(cst.Name(name), _as_strided(storage_name, spec)),
    ]


def _as_strided(storage: cst.BaseExpression, spec: TensorSpec) -> cst.Call:
    stride = spec.stride if spec.stride is not None else _contiguous(spec.shape)
    args = [_shape(spec.shape), literal(tuple(stride))]
    if spec.storage_offset:
        args.append(literal(spec.storage_offset))
    return _call(cst.Attribute(storage, cst.Name("as_strided")), *args)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    from reprocut.model.case import contiguous_stride

    return contiguous_stride(shape)


def _assign(
    target: cst.BaseAssignTargetExpression, value: cst.BaseExpression
) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Assign(targets=[cst.AssignTarget(target)], value=value)])


# --- argument names --------------------------------------------------------------------------

_RENAMES = {"self": "x", "input": "x", "indices": "ids"}
_INDEX_NAMES = {"self": "ids", "input": "ids"}  # an integer first argument is a set of indices


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


def _variable_name(preferred: str | None, index: int, taken: set[str]) -> str:
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


# --- the call ----------------------------------------------------------------------------------


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
            return _assign(subscript, args[2])
        return cst.SimpleStatementLine([cst.Expr(subscript)])
    if case.target.startswith("torch.Tensor."):
        if not args:
            raise EmitError(f"method {case.target} needs its tensor as the first argument")
        method = cst.Attribute(value=args[0], attr=cst.Name(case.target.rsplit(".", 1)[-1]))
        return cst.SimpleStatementLine([cst.Expr(_call(method, *args[1:], **kwargs))])
    return cst.SimpleStatementLine([cst.Expr(_call(case.target, *args, **kwargs))])


# --- header ----------------------------------------------------------------------------------


def data_origin(case: ReproCase) -> str:
    """ "real", "synthetic" or "mixed": did the values come from the user's run?"""
    kinds = {
        isinstance(spec.values, (Captured, Literal)) for _, spec in case.tensors()
    }  # Literal values were inlined from captured data or written by the shrinker
    if kinds == {True}:
        return "real (values captured from the failing run)"
    if kinds == {False} or not kinds:
        return "synthetic (generated tensors)"
    return "mixed: captured values where they matter, generated elsewhere"


def header_text(case: ReproCase, header: Header) -> str:
    expected = header.expected or case.expected
    lines = [f"Minimal reproduction of a failure in {case.aten_op or case.target}."]
    lines.append("")
    if expected is not None:
        lines.append(f"Expected: {expected.describe()}")
    if header.message:
        lines.append(f"Message: {header.message.strip().splitlines()[0]}")
    if header.assertion:
        lines.append(f"Assertion: {header.assertion}")
    lines.append(f"Call: {case.target}")
    lines.append(f"Data: {data_origin(case)}")
    if header.cpu_reproduces is None:
        lines.append("CPU: not checked")
    elif header.cpu_reproduces:
        lines.append(f"CPU: reproduces too ({header.cpu_message or 'same signature'})")
    else:
        lines.append(
            "CPU: does not reproduce" + (f" ({header.cpu_message})" if header.cpu_message else "")
        )
    lines.append("")
    lines.append("Seen on:")
    lines.extend(f"  {line}" for line in header.environment.lines())
    lines.append("")
    lines.append("Run: python repro.py")
    return "\n".join(lines)


# --- the module --------------------------------------------------------------------------------


def inline_captured(
    case: ReproCase, inputs: Mapping[str, Any], limit: int = INLINE_LIMIT
) -> ReproCase:
    """Captured values small enough to read become Literals; larger ones stay for the sidecar."""
    new = case
    for path, spec in case.tensors():
        if isinstance(spec.values, Captured) and spec.values.key in inputs and spec.numel <= limit:
            flat = inputs[spec.values.key].detach().cpu().reshape(-1).tolist()
            new = new.with_arg(path, replace(spec, values=Literal(tuple(flat[: spec.numel]))))
    return new


def emit(case: ReproCase, header: Header | None = None) -> Emitted:
    """The repro.py text for `case` (Captured values are loaded from repro_inputs.pt beside it)."""
    header = header or Header(expected=case.expected)
    positional = parameter_names(case)
    taken: set[str] = set()
    names: dict[tuple[Any, ...], str] = {}
    body: list[cst.BaseStatement] = []
    sidecar: list[str] = []
    specs = list(case.tensors())
    if any(isinstance(s.values, Generated) and s.values.kind in RANDOM_KINDS for _, s in specs):
        body.append(cst.SimpleStatementLine([cst.Expr(_call("torch.manual_seed", literal(0)))]))
    if any(isinstance(s.values, Captured) for _, s in specs):
        here = _call("pathlib.Path", cst.Name("__file__"))
        location = _call(cst.Attribute(here, cst.Name("with_name")), literal(SIDECAR_NAME))
        body.append(
            _assign(
                cst.Name("inputs"), _call("torch.load", location, weights_only=cst.Name("True"))
            )
        )
    for path, spec in specs:
        if path[0] == "args":
            preferred = positional[path[1]] if path[1] < len(positional) else None
        else:
            preferred = path[1]
        if len(path) > 2:
            preferred = f"{preferred or 't'}{path[-1]}"
        if spec.dtype in INT_DTYPES and preferred in _INDEX_NAMES:
            preferred = _INDEX_NAMES[preferred]
        names[path] = _variable_name(preferred, len(names), taken)
        if isinstance(spec.values, Captured):
            sidecar.append(spec.values.key)
        body.extend(tensor_statements(names[path], spec))
    body.append(call_statement(case, names))
    if any(spec.device.startswith("cuda") for _, spec in specs):
        body.append(cst.SimpleStatementLine([cst.Expr(_call("torch.cuda.synchronize"))]))
    template = SIDECAR_TEMPLATE if sidecar else TEMPLATE
    module = parse_template_module(template)
    module = module.visit(_FillMain(body))
    first = module.body[0].with_changes(leading_lines=[cst.EmptyLine()])
    docstring = _docstring(header_text(case, header))
    module = module.with_changes(body=[docstring, first, *module.body[1:]])
    return Emitted(
        code=module.code, statements=len(body), sidecar_keys=tuple(dict.fromkeys(sidecar))
    )


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
    "Environment",
    "Header",
    "count_statements",
    "emit",
    "inline_captured",
]
