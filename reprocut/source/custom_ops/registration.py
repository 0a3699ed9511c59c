"""Which code registers a custom operator, read from its text.

A custom op is registered in one of three ways, and each leaves its name in the source: Python
decorators and calls that name it `"ns::op"` (`custom_op`, `triton_op`, `torch.library.define`,
`register_fake("ns::op")`); a `torch.library.Library("ns", ...)` whose `define`/`impl` name
`"op(...)"`/`"op"`; or a C++ source string holding a `TORCH_LIBRARY(ns, m)` block, which
registers once `cpp_extension.load_inline` builds and loads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from reprocut.source.passes.walk import walk

BUILTIN_NAMESPACES = frozenset(
    {"aten", "prims", "_ops", "profiler", "quantized", "_c10d_functional"}
)
_TARGET = re.compile(r"^torch\.ops\.(?P<ns>\w+)\.(?P<op>\w+)(?:\.\w+)?$")
# attributes of a custom op's Python object that extend its registration
# (`@op.register_fake`, `op.register_autograd(...)`, `op.register_kernel("cpu")`)
EXTENDING_PREFIX = "register"


def custom_op_name(target: str) -> str | None:
    """`ns::op` for `torch.ops.ns.op.overload` outside aten/prims; None for anything else."""
    match = _TARGET.match(target)
    if match is None or match["ns"] in BUILTIN_NAMESPACES:
        return None
    return f"{match['ns']}::{match['op']}"


@dataclass(frozen=True, slots=True)
class OpName:
    """`ns::op`, and the patterns its registrations are written with."""

    qualified: str

    @property
    def namespace(self) -> str:
        return self.qualified.split("::")[0]

    @property
    def op(self) -> str:
        return self.qualified.split("::")[1]

    def named_in_python(self, text: str) -> bool:
        """The qualified name as a string literal: `custom_op("ns::op", ...)` and the like."""
        return re.search(rf"""["']{re.escape(self.qualified)}(?:\.\w+)?["'(]""", text) is not None

    def in_cpp_library(self, text: str) -> bool:
        """A C++ `TORCH_LIBRARY(ns, m)` block (or a fragment or impl block of ns)."""
        pattern = rf"TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?\(\s*{re.escape(self.namespace)}\s*,"
        return re.search(pattern, text) is not None

    def binds_library(self, text: str) -> bool:
        """`torch.library.Library("ns", ...)`."""
        return re.search(rf"""Library\(\s*["']{re.escape(self.namespace)}["']""", text) is not None

    def named_as_schema(self, text: str) -> bool:
        """`"op(Tensor x) -> Tensor"` (a schema) or `"op"` / `"op.overload"` (an impl's name)."""
        pattern = rf"""["']{re.escape(self.op)}(?:\.\w+)?\s*(?:\(|["'])"""
        return re.search(pattern, text) is not None


def registers(text: str, qualified: str) -> bool:
    """Does `text` register `ns::op`: the qualified name as a string (custom_op, triton_op,
    torch.library.define), or a TORCH_LIBRARY block / Library("ns") defining `op(`?"""
    name = OpName(qualified)
    if name.named_in_python(text):
        return True
    library = name.in_cpp_library(text) or name.binds_library(text)
    return library and name.named_as_schema(text)


def extends(statement: cst.CSTNode, op_names: set[str]) -> bool:
    """Does `statement` extend the registration of an op bound to one of `op_names`:
    `@op.register_fake`, `op.register_autograd(...)`, `torch.library.register_fake(op)`?"""
    for node in walk(statement):
        if (
            isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.value.value in op_names
            and node.attr.value.startswith(EXTENDING_PREFIX)
        ):
            return True
        if (
            isinstance(node, cst.Call)
            and _is_library_call(node.func)
            and any(isinstance(a.value, cst.Name) and a.value.value in op_names for a in node.args)
        ):
            return True
    return False


def _is_library_call(func: cst.BaseExpression) -> bool:
    """`torch.library.register_fake`, `torch.library.register_autograd`, ... (any attribute
    chain ending in `library.register_*`)."""
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value.startswith(EXTENDING_PREFIX)
        and isinstance(func.value, (cst.Attribute, cst.Name))
        and cst.Module([]).code_for_node(func.value).endswith("library")
    )
