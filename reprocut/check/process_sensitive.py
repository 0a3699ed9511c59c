"""What in a candidate a fork server's child may run differently from a fresh `python`: the
words of its code (not its comments) that name devices, layouts, raw pointers, the environment
or processes, counted (`fingerprint`), and whether it is aten ops alone (`aten_only`). The plain
agreement (check/agreement.py) runs a candidate plainly when these change."""

from __future__ import annotations

import ast
import re
from collections import Counter

# What a fork can make behave differently: devices, layouts and views, raw pointers, the
# environment, processes. A change in how often any of these appears is worth a plain run.
PROCESS_SENSITIVE = re.compile(
    r"\bcuda\b|\bcpu\b|\bdevice\b|\bsparse_\w+|\bto_sparse\w*|\bas_strided\b|\bdata_ptr\b|"
    r"\bcontiguous\b|\bexpand\w*|\bpin_memory\b|\bstrides?\b|\bstorage_offset\b|\benviron\b|"
    r"\bfork\b|\bspawn\b|\bmultiprocessing\b"
)
# what makes a candidate more than aten ops on its own tensors: an op outside aten/prims (its
# kernel may read raw memory), a raw pointer, a kernel library
NOT_ATEN = re.compile(
    r"\btorch\.ops\.(?!aten\b|prims\b)\w+|\bdata_ptr\b|\bcupy\b|\btriton\b|\bload_inline\b|"
    r"\bcpp_extension\b|\bctypes\b"
)

Fingerprint = tuple[tuple[str, int], ...]


def fingerprint(code: str) -> Fingerprint:
    """How often each process-sensitive word occurs in what `code` runs: its comments and
    docstrings aside. A docstring telling of `.expand(B, -1, -1)` on "CUDA only" made the cut
    that strips it a process-sensitive change on the H200, whose plain run the next such
    candidate then waited for (3-7 s of each CuPy and Triton reduction's critical path)."""
    return tuple(sorted(Counter(PROCESS_SENSITIVE.findall(_what_runs(code))).items()))


def _what_runs(code: str) -> str:
    """`code` without comments and docstrings (as it is, if it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        if isinstance(node, documented) and node.body and _is_docstring(node.body[0]):
            node.body[0] = ast.Pass()
    return ast.unparse(tree)


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def aten_only(code: str) -> bool:
    """`code` calls aten ops on tensors it makes, and nothing that reads raw memory."""
    return NOT_ATEN.search(code) is None


def grew(mark: Fingerprint, confirmed: Fingerprint) -> bool:
    """Some process-sensitive word occurs more often in `mark` than in `confirmed`."""
    before = dict(confirmed)
    return any(count > before.get(word, 0) for word, count in mark)
