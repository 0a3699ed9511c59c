"""Names for what the user called: public dotted paths for torch functions, aten names for ops.

A TorchFunctionMode hands us function objects (`torch._C._nn.one_hot` is `F.one_hot`); a repro
must call them by a public path, so we index the public namespaces once and look objects up by id.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

PUBLIC_NAMESPACES = (
    "torch.nn.functional",
    "torch",
    "torch.Tensor",
    "torch.linalg",
    "torch.special",
    "torch.fft",
    "torch.sparse",
)


@functools.cache
def _public_index() -> dict[int, str]:
    index: dict[int, str] = {}
    for namespace in reversed(PUBLIC_NAMESPACES):  # earlier namespaces win
        module: Any = torch
        for part in namespace.split(".")[1:]:
            module = getattr(module, part)
        if isinstance(module, type):  # methods live on the C base class too
            members = {name: getattr(module, name, None) for name in dir(module)}
        else:
            members = dict(vars(module))
        for name, obj in members.items():
            if name.startswith("_") and name not in ("__getitem__", "__setitem__"):
                continue
            if callable(obj):
                index[id(obj)] = f"{namespace}.{name}"
    return index


def public_name(func: Any) -> str | None:
    """The public dotted path of a torch callable, or None for internals and properties."""
    name = _public_index().get(id(func))
    if name is not None:
        return name
    wrapped = getattr(func, "__wrapped__", None)
    if wrapped is not None:
        return _public_index().get(id(wrapped))
    return None


def aten_name(op: Any) -> str:
    """`aten::embedding` for an OpOverload (the overload name is left out: it varies by args)."""
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return str(schema.name)
    return str(op)


def aten_path(op: Any) -> str:
    """`torch.ops.aten.embedding.default`: a callable path for an OpOverload."""
    namespace, _, name = aten_name(op).partition("::")
    overload = getattr(op, "_overloadname", "default") or "default"
    return f"torch.ops.{namespace}.{name}.{overload}"


def is_inplace(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    return any(arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments)


def composite_op(public_call: str | None) -> str | None:
    """`aten::one_hot` for `torch.nn.functional.one_hot`: the aten op a public call binds, when
    that op is CompositeImplicitAutograd. Such an op decomposes before any dispatch mode sees
    it, so its own checks (one_hot's class range) raise with no dispatched op raising: the
    public call's aten op is then the op to name. None for Python functions (F.linear's wrapper
    is no binding of one op) and names with no aten op."""
    func = _resolve(public_call) if public_call else None
    if not isinstance(func, (types.BuiltinFunctionType, types.MethodDescriptorType)):
        return None
    name = f"aten::{func.__name__}"
    try:
        composite = torch._C._dispatch_has_kernel_for_dispatch_key(
            name, "CompositeImplicitAutograd"
        )
    except RuntimeError:  # no aten op of that name
        return None
    return name if composite else None


def _resolve(path: str) -> Any:
    """The object a dotted `torch....` path names, or None."""
    head, *rest = path.split(".")
    if head != "torch":
        return None
    found: Any = torch
    for part in rest:
        found = getattr(found, part, None)
        if found is None:
            return None
    return found
