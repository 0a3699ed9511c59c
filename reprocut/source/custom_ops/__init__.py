"""A custom operator's own code, for a repro that calls it.

An op outside `aten`/`prims` (`torch.library.custom_op`, `triton_op`, a `TORCH_LIBRARY`
extension built with `cpp_extension.load_inline`) exists only once the user's module that
registers it has run: a repro calling `torch.ops.<ns>.<op>` must carry that code, or it fails
with "no such operator" instead of the user's bug. `definitions_for` finds the file that
registers the op among the script and its sibling modules and keeps the statements the
registration needs (registration.py says which register, guards.py resolves the import guards
and GPU checks they sit under, slicing.py keeps what they need): imports, constants, kernels,
helpers, `register_fake` and the like, never the training loop. The extension's C++/CUDA source
strings stay as they are, so the repro builds the op itself from an empty folder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from reprocut.source.custom_ops.depends import dependencies
from reprocut.source.custom_ops.guards import Facts, code_of
from reprocut.source.custom_ops.modules import module_resolver, user_files
from reprocut.source.custom_ops.registration import (
    BUILTIN_NAMESPACES,
    OpName,
    custom_op_name,
    registers,
    walk,
)
from reprocut.source.custom_ops.slicing import slice_registration, top_level

Importable = Callable[[str], bool]  # can `import <name>` find the module


def registering_file(qualified: str, files: Iterable[Path]) -> Path | None:
    """The first of `files` (the script first) whose code registers `qualified`."""
    for path in files:
        try:
            if registers(path.read_text(), qualified):
                return path
        except (OSError, UnicodeDecodeError):
            continue
    return None


def facts_for(
    search_dirs: Sequence[Path], device: str | None, importable: Importable | None = None
) -> Facts:
    """What the guards may be resolved with: whether CUDA was there (from the failure's
    device), and which modules can be imported (the user's own, or installed ones; the
    machine that shrinks is the one that recorded). `importable`: that answer, given."""
    resolve = module_resolver(search_dirs)
    facts = Facts(cuda=None if device is None else device.startswith("cuda"))
    installed = importable or facts.importable
    facts.importable = lambda name: resolve(name) is not None or installed(name)
    return facts


def slice_definitions(
    code: str,
    qualified: str,
    *,
    search_dirs: Sequence[Path] = (),
    device: str | None = None,
    importable: Importable | None = None,
) -> str:
    """The statements of `code` the registration of `qualified` needs, in their order, with
    its guards resolved to the branches that ran and the user's modules it imports from
    inlined. `from __future__` imports are left out (they must open a file)."""
    facts = facts_for(search_dirs, device, importable)
    resolve = module_resolver(search_dirs) if search_dirs else None
    return slice_registration(code, qualified, facts, resolve).code


def definitions_for(
    target: str,
    files: Iterable[Path],
    *,
    device: str | None = None,
    importable: Importable | None = None,
) -> str:
    """The code a repro calling `target` must run first ("" for aten ops, or when no file
    registers it). `device`: the failure's, which decides `torch.cuda.is_available()` guards;
    `importable`: which modules import (by default: those this interpreter finds)."""
    qualified = custom_op_name(target)
    files = list(files)
    path = None if qualified is None else registering_file(qualified, files)
    if qualified is None or path is None:
        return ""
    # the user's modules import each other as `python <script>` finds them: from the
    # script's folder (a package's module: from its own folder too)
    search_dirs = tuple(dict.fromkeys([files[0].parent, path.parent]))
    return slice_definitions(
        path.read_text(), qualified, search_dirs=search_dirs, device=device, importable=importable
    )


def registering_names(qualified: str, files: Iterable[Path]) -> tuple[str, ...]:
    """The Python names bound by the statements that register `qualified` (the decorated
    function of a custom_op or triton_op, under whatever guard): calling one calls the op."""
    path = registering_file(qualified, files)
    if path is None:
        return ()
    name = OpName(qualified)
    facts = facts_for((path.parent,), None)
    names: list[str] = []
    for statement in top_level(path.read_text(), qualified, facts):
        if name.named_in_python(code_of(statement)):
            names.extend(sorted(dependencies([statement]).binds[0]))
    return tuple(names)


__all__ = [
    "BUILTIN_NAMESPACES",
    "custom_op_name",
    "definitions_for",
    "registering_file",
    "registering_names",
    "registers",
    "slice_definitions",
    "user_files",
    "walk",
]
