"""What the README's test command installs is enough to run the tests: every third-party module
the tests, their scripts and the cases they run import is declared in pyproject.toml (numpy was
not, and CI passed only because the machine had it)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).parent.parent
# What the tests run: the tests and their scripts, the examples and corpus (test_corpus), the
# benchmark modules the tests import and the source cases they reduce.
SCANNED = ("tests", "examples", "corpus", "benchmarks")
GPU_ONLY = {"triton", "cupy", "cupy_backends"}  # imported only by cuda-marked tests and cases
IMPORT_NAMES = {"pytorch-lightning": "pytorch_lightning", "pyyaml": "yaml"}  # dist -> module


def declared() -> set[str]:
    """Module names of the project's dependencies and its `test` extra."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    names = set()
    for requirement in requirements:
        dist = re.match(r"[A-Za-z0-9_.\-]+", requirement)[0].lower()
        names.add(IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    return names


def optional_imports(tree: ast.AST) -> set[int]:
    """ids of import nodes inside `try: ... except ImportError` (an optional import, the way
    users guard a compiled extra: not a dependency)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return guarded


def imported(path: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:
        return set()
    optional = optional_imports(tree)
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_third_party_import_of_the_tests_is_declared():
    files = [p for top in SCANNED for p in (REPO / top).rglob("*.py") if "results" not in p.parts]
    local = {p.stem for p in files} | {p.parent.name for p in files} | {"reprocut"}
    undeclared = {}
    for path in files:
        for name in imported(path) - local - set(sys.stdlib_module_names) - GPU_ONLY:
            if name not in declared():
                undeclared.setdefault(name, path.relative_to(REPO))
    assert not undeclared, (
        f"imported but not in pyproject's dependencies or test extra: {undeclared}"
    )
