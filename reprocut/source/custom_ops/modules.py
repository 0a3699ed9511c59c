"""The user's own modules: which file `import name` loads from the script's folder, and every
module the script reaches through such imports (the op may be registered two imports away:
train.py imports model.py, which imports ops.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import libcst as cst

from reprocut.source.custom_ops.guards import code_of
from reprocut.source.custom_ops.registration import walk

# `from <module> import ...` of the user's own module -> that module's file, or None
Resolver = Callable[[str], Path | None]


def module_resolver(search_dirs: Sequence[Path]) -> Resolver:
    """`import <name>` -> the user's own module file it loads, if one of `search_dirs`
    holds it (the script's folder: what `python train.py` puts on sys.path)."""

    def resolve(name: str) -> Path | None:
        parts = name.split(".")
        for directory in search_dirs:
            for candidate in (
                directory.joinpath(*parts).with_suffix(".py"),
                directory.joinpath(*parts, "__init__.py"),
            ):
                if candidate.is_file():
                    return candidate
        return None

    return resolve


def imported_names(code: str) -> list[str]:
    """Every module `code` imports, wherever the import stands (under a guard, in a function);
    for `from a import b`, both `a.b` (b may be a submodule) and `a`."""
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return []
    names: list[str] = []
    for node in walk(module):
        if isinstance(node, cst.Import):
            names.extend(code_of(alias.name) for alias in node.names)
        elif isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative:
            base = code_of(node.module)
            if not isinstance(node.names, cst.ImportStar):
                names.extend(f"{base}.{code_of(alias.name)}" for alias in node.names)
            names.append(base)
    return names


def user_files(script: Path, search_dirs: Sequence[Path] | None = None) -> list[Path]:
    """`script` and the user's modules it reaches through imports, transitively, in the
    order they are first reached (the script first)."""
    resolve = module_resolver(search_dirs or (script.parent,))
    found = [script.resolve()]
    pending = [script.resolve()]
    while pending:
        path = pending.pop(0)
        try:
            code = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        for name in imported_names(code):
            target = resolve(name)
            if target is not None and target.resolve() not in found:
                found.append(target.resolve())
                pending.append(target.resolve())
    return found
