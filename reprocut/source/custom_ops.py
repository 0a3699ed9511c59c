"""A custom operator's own code, for a repro that calls it.

An op outside `aten`/`prims` (`torch.library.custom_op`, `triton_op`, a `TORCH_LIBRARY`
extension built with `cpp_extension.load_inline`) exists only once the user's module that
registers it has run: a repro calling `torch.ops.<ns>.<op>` must carry that code, or it fails
with "no such operator" instead of the user's bug. `definitions_for` finds the file that
registers the op among the script and its sibling modules and keeps the top-level statements
the registration needs (imports, constants, kernels, helpers, `register_fake` and the like),
dropping the training loop and the rest; the extension's C++/CUDA source strings stay as they
are, so the repro builds the op itself from an empty folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import libcst as cst

BUILTIN_NAMESPACES = frozenset(
    {"aten", "prims", "_ops", "profiler", "quantized", "_c10d_functional"}
)
_TARGET = re.compile(r"^torch\.ops\.(?P<ns>\w+)\.(?P<op>\w+)(?:\.\w+)?$")


def custom_op_name(target: str) -> str | None:
    """`ns::op` for `torch.ops.ns.op.overload` outside aten/prims; None for anything else."""
    match = _TARGET.match(target)
    if match is None or match["ns"] in BUILTIN_NAMESPACES:
        return None
    return f"{match['ns']}::{match['op']}"


def registers(text: str, qualified: str) -> bool:
    """Does `text` register `ns::op`: the qualified name as a string (custom_op, triton_op,
    torch.library.define), or a TORCH_LIBRARY block / Library("ns") defining `op(`?"""
    namespace, op = qualified.split("::")
    if re.search(rf"""["']{re.escape(qualified)}["'(]""", text):
        return True
    library = re.search(rf"""TORCH_LIBRARY(?:_FRAGMENT)?\(\s*{namespace}\s*,|Library\(\s*["']{namespace}["']""", text)  # fmt: skip
    return library is not None and re.search(rf"""["']{re.escape(op)}\s*\(""", text) is not None


def registering_file(qualified: str, files: Iterable[Path]) -> Path | None:
    """The first of `files` (the script first) whose code registers `qualified`."""
    for path in files:
        try:
            if registers(path.read_text(), qualified):
                return path
        except OSError:
            continue
    return None


def _defined(statement: cst.CSTNode) -> set[str]:
    """Names a top-level statement binds."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return {statement.name.value}
    names: set[str] = set()
    for node in walk(statement):
        if isinstance(node, cst.ImportAlias):
            target = node.asname.name if node.asname else node.name
            if isinstance(target, cst.Name):
                names.add(target.value)
            elif isinstance(target, cst.Attribute):
                names.add(cst.Module([]).code_for_node(target).split(".")[0])
        elif isinstance(node, (cst.AssignTarget, cst.AnnAssign)):
            target = node.target
            for inner in walk(target):
                if isinstance(inner, cst.Name):
                    names.add(inner.value)
    return names


def _used(statement: cst.CSTNode) -> set[str]:
    return {node.value for node in walk(statement) if isinstance(node, cst.Name)}


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node` and every node below it, depth first."""
    yield node
    for child in node.children:
        yield from walk(child)


def _is_script_entry(statement: cst.CSTNode) -> bool:
    """`if __name__ == "__main__":` and loops: the program, not the op's definition."""
    if isinstance(statement, (cst.For, cst.While, cst.With, cst.Try)):
        return True
    return isinstance(statement, cst.If) and "__name__" in _used(statement.test)


def slice_definitions(code: str, qualified: str) -> str:
    """The statements of `code` the registration of `qualified` needs, in their order: the
    registering ones, those that extend it (`@op.register_fake`, `op.register_autograd(...)`),
    and, transitively, whatever binds a name they use. `from __future__` imports are left out
    (they must open a file)."""
    module = cst.parse_module(code)
    body = [s for s in module.body if not _is_future(s) and not _is_script_entry(s)]
    texts = [module.code_for_node(s) for s in body]
    roots = {i for i, text in enumerate(texts) if registers(text, qualified)}
    op_names = set().union(*(_defined(body[i]) for i in roots)) if roots else set()
    roots |= {
        i
        for i, s in enumerate(body)
        if op_names & _used(s) and not (_defined(s) & op_names) and not isinstance(s, cst.Import)
        and not _is_import_from(s)
    }  # fmt: skip
    kept = set(roots)
    pending = set().union(*(_used(body[i]) for i in roots)) if roots else set()
    bound: set[str] = set()
    while pending:
        name = pending.pop()
        bound.add(name)
        for i, statement in enumerate(body):
            if i not in kept and name in _defined(statement):
                kept.add(i)
                pending |= _used(statement) - bound
    kept_body = [body[i] for i in sorted(kept)]
    if not kept_body:
        return ""
    kept_body[0] = kept_body[0].with_changes(leading_lines=[])
    return cst.Module(body=kept_body).code


def _is_future(statement: cst.CSTNode) -> bool:
    return _is_import_from(statement) and "__future__" in cst.Module([statement]).code  # type: ignore[list-item]


def _is_import_from(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(
        statement.body[0], cst.ImportFrom
    )


def definitions_for(target: str, files: Iterable[Path]) -> str:
    """The code a repro calling `target` must run first ("" for aten ops, or when no file
    registers it)."""
    qualified = custom_op_name(target)
    if qualified is None:
        return ""
    path = registering_file(qualified, files)
    if path is None:
        return ""
    return slice_definitions(path.read_text(), qualified)


def registering_names(qualified: str, files: Iterable[Path]) -> tuple[str, ...]:
    """The Python names bound by the statements that register `qualified` (the decorated
    function of a custom_op or triton_op): calling one calls the op."""
    path = registering_file(qualified, files)
    if path is None:
        return ()
    module = cst.parse_module(path.read_text())
    names: list[str] = []
    for statement in module.body:
        if registers(module.code_for_node(statement), qualified):
            names.extend(sorted(_defined(statement)))
    return tuple(names)
