"""The failing call's text (the focus line) taken apart, and the statement covering a line.

The probe and the localizer name what reaches a launch by its source: the object called
(`add_kernel` for `add_kernel[grid](...)`), each argument's text, the grid. These read the
focus line with libcst and nothing else: no process, no tensors. `statement_span` finds the
whole statement a traceback's line belongs to, the focus itself.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import libcst.matchers as m
import libcst.metadata

from reprocut.source.passes import focus_callee, parse


def launched_source(focus: str) -> str | None:
    """The object the focus line calls, as code: `add_kernel` for `add_kernel[grid](...)`."""
    callee = focus_callee(focus)
    if callee is None:
        return None
    node = cst.parse_expression(callee)
    while isinstance(node, cst.Subscript):
        node = node.value
    return cst.Module(body=[]).code_for_node(node)


def call_argument_sources(focus: str) -> list[str]:
    """The source text of each positional argument of the focus line's call."""
    call = _focus_call(focus)
    if call is None:
        return []
    module = cst.Module(body=[])
    return [module.code_for_node(a.value) for a in call.args if a.keyword is None]


def call_keyword_sources(focus: str) -> list[tuple[str, str]]:
    """The name and source text of each keyword argument of the focus line's call."""
    call = _focus_call(focus)
    if call is None:
        return []
    module = cst.Module(body=[])
    return [(a.keyword.value, module.code_for_node(a.value)) for a in call.args if a.keyword]


def launch_grid_source(focus: str) -> str | None:
    """The grid of a `kernel[grid](...)` launch, as code: `grid`, `(n // 1024,)`."""
    call = _focus_call(focus)
    if call is None or not isinstance(call.func, cst.Subscript) or len(call.func.slice) != 1:
        return None
    index = call.func.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    return cst.Module(body=[]).code_for_node(index.value)


def _focus_call(focus: str) -> cst.Call | None:
    """The focus line's outermost call."""
    try:
        statement = cst.parse_statement(focus.strip() + "\n")
    except cst.ParserSyntaxError:
        return None
    calls = [c for c in m.findall(statement, m.Call()) if isinstance(c, cst.Call)]
    return calls[0] if calls else None


def statement_span(path: Path, line: int) -> tuple[str, int, int] | None:
    """The whole simple statement that covers `line` (a call spread over lines included): its
    text and its first and last lines."""
    module = parse(path.read_text())
    if module is None:
        return None
    wrapper = cst.metadata.MetadataWrapper(module)
    positions = wrapper.resolve(cst.metadata.PositionProvider)
    for node, span in positions.items():
        if isinstance(node, cst.BaseSmallStatement) and span.start.line <= line <= span.end.line:
            return module.code_for_node(node), span.start.line, span.end.line
    return None


def statement_text(path: Path, line: int) -> str | None:
    """The text of the whole simple statement that covers `line`."""
    found = statement_span(path, line)
    return None if found is None else found[0]
