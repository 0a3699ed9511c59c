"""Candidates run in the test's own process, for reducer tests that need no fork server: what
each one raises, as a Signature; "bad value <n>" is the bug they keep."""

from __future__ import annotations

from reprocut.model.case import Signature

BAD = Signature("ValueError", None, None, "bad value <n>")


def failure_of(source: str) -> Signature | None:
    """The candidate's failure when run as `__main__` here (None: it passed)."""
    try:
        exec(compile(source, "<candidate>", "exec"), {"__name__": "__main__"})
    except Exception as exc:
        kind = "bad value <n>" if str(exc).startswith("bad value") else str(exc)
        return Signature(type(exc).__name__, None, None, kind)
    return None
