"""The failing call ("focus") a candidate must keep making: the line that failed, its callee,
and the calls to that callee in a candidate. A repro must keep calling the kernel or helper
that failed, not re-raise its error by hand; the reducer and several validity rules ask this
of every candidate.
"""

from __future__ import annotations

from functools import lru_cache

import libcst as cst
import libcst.matchers as m

from reprocut.source.passes.tree import parse
from reprocut.source.passes.walk import of_type


@lru_cache(maxsize=16)
def focus_callee(focus: str | None) -> str | None:
    """The called expression of the failing line (`add_kernel[grid]`), as code (read once per
    line: every candidate is asked whether it still makes that call)."""
    if not focus:
        return None
    try:
        statement = cst.parse_statement(focus.strip() + "\n")
    except cst.ParserSyntaxError:
        return None
    calls = m.findall(statement, m.Call())
    if not calls:
        return None
    call = calls[0]
    assert isinstance(call, cst.Call)
    return cst.Module(body=[]).code_for_node(call.func)


def calls_focus(code: str, focus: str | None) -> bool | None:
    """Does the code still make the failing call? None when there is no focus call to look for."""
    callee = focus_callee(focus)
    module = parse(code)
    if callee is None or module is None:
        return None
    return bool(_calls_to(module, callee))


def focus_calls(module: cst.Module, focus: str | None) -> list[cst.Call]:
    """The calls in `module` to the failing line's callee (shared: read only)."""
    callee = focus_callee(focus)
    return [] if callee is None else _calls_to(module, callee)


@lru_cache(maxsize=16)  # the reducer and several rules ask it of each candidate's module
def _calls_to(module: cst.Module, callee: str) -> list[cst.Call]:
    last = callee.rsplit(".", 1)[-1].strip()  # a callee's last name: most calls end elsewhere
    return [
        c
        for c in of_type(module, cst.Call)
        if _last_name(c.func) in (last, None) and module.code_for_node(c.func) == callee
    ]


def _last_name(func: cst.BaseExpression) -> str | None:
    """`f` for `f` and `a.b.f`; None for what ends otherwise (`k[grid]`, `f()`)."""
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None
