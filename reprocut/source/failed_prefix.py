"""Candidates that would raise where a checked one raised: the same code up to that statement.

A script runs top to bottom. When a candidate raised another failure from a module-level
statement (`OtherFailure.line`), any later candidate whose text is the same up to the end of
that statement runs the same code to the same raise: it cannot reproduce, and its check is not
paid for. On the CPU stand-in of the corpus's misaligned-address case (a vendored kernel behind
`sys.path.insert`), 29 of a reduction's 76 checks were such repeats: the passes break the
import's `sys.path` line in every round, and two passes break it the same way.

Only a failure that the code before it decides is kept: not a CUDA error (the same launch of
one cut raised either of two on the H200), not an out-of-memory error (checks side by side
share the GPU), not a failure with no module-level line (a syntax error, a crash).
"""

from __future__ import annotations

import ast
from typing import Any

from reprocut.check.verdicts import OtherFailure
from reprocut.model.signature import is_cuda_failure


class FailedPrefixes:
    """The texts, each up to the end of a module-level statement, that raised another failure."""

    def __init__(self) -> None:
        self._by_length: dict[int, set[str]] = {}  # lines in the prefix -> prefixes

    def add(self, code: str, verdict: Any, best: str = "") -> bool:
        """Keep the prefix of `code` that `verdict` says raised (True when it was kept). Not
        when `best`, which reproduces, begins with the same prefix: the same code raised
        otherwise in one run and not in the other, so it is the run, not the code (a flaky
        read of a file), and keeping it would refuse every candidate that edits later lines."""
        if not isinstance(verdict, OtherFailure) or verdict.line is None or _may_vary(verdict):
            return False
        end = _statement_end(code, verdict.line)
        if end is None:
            return False
        prefix = "\n".join(code.splitlines()[:end])
        if best and "\n".join(best.splitlines()[:end]) == prefix:
            return False
        self._by_length.setdefault(end, set()).add(prefix)
        return True

    def covers(self, code: str) -> bool:
        """Does `code` begin with a kept prefix, whole statements of it, and so raise there too?"""
        lines = code.splitlines() if self._by_length else []
        for end, prefixes in self._by_length.items():
            if "\n".join(lines[:end]) in prefixes and _ends_a_statement(code, end):
                return True
        return False

    def __len__(self) -> int:
        return sum(len(prefixes) for prefixes in self._by_length.values())


def _may_vary(verdict: OtherFailure) -> bool:
    """Could the same code fail otherwise, or not at all, on another run?"""
    signature = verdict.signature
    return (
        is_cuda_failure(signature.error_type, verdict.message, signature.error_code)
        or "out of memory" in f"{signature.kind} {verdict.message}".lower()
    )


def _statements(code: str) -> list[ast.stmt] | None:
    try:
        return ast.parse(code).body
    except (SyntaxError, ValueError):
        return None


def _statement_end(code: str, line: int) -> int | None:
    """The last line of the module-level statement that holds `line` (its decorators too)."""
    for statement in _statements(code) or []:
        decorators = getattr(statement, "decorator_list", [])
        first = min([statement.lineno, *(d.lineno for d in decorators)])
        end = statement.end_lineno
        if end is not None and first <= line <= end:
            return end
    return None


def _ends_a_statement(code: str, line: int) -> bool:
    """Does a module-level statement of `code` end on `line`? Not when what follows carries
    the statement on (an `except` or `else` clause added to the `try` that raised)."""
    return any(s.end_lineno == line for s in _statements(code) or [])
