"""Reduce a recording's script: find the failing call, probe what reaches it, run the loop.

`reduce_recorded` takes a `reprocut.model.recording.Failure` and hands `reduce_source` the
files it may edit (the script and its sibling modules), the innermost failing frame among them
as the focus, and the tensors probed there; `pin_script_dir` makes the result runnable
wherever the repro is written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as m

from reprocut.model.limits import CHECK_CAP
from reprocut.source.call_frame import callable_with, outer_call_frame
from reprocut.source.focus import statement_text
from reprocut.source.launch_specs import LaunchSpecs, with_value_ranges
from reprocut.source.passes import sibling_imports
from reprocut.source.probe import (
    KeptLaunch,
    failing_frames,
    kept_launch,
    probe_launches,
    traceback_frames,
)
from reprocut.source.reducer import reduce_source
from reprocut.source.results import SourceEvent, SourceResult
from reprocut.source.validity import reducible_files


def reduce_recorded(
    failure: Any,
    *,
    oracle: Any = None,
    max_checks: int = CHECK_CAP,
    max_time: float | None = None,
    on_event: Callable[[SourceEvent], None] | None = None,
    timeout: float = 60.0,
    kept: Path | None = None,
    traceback: str = "",
) -> SourceResult:
    """`reduce_source` for a recording (`reprocut.model.recording.Failure`): the failing call is the
    innermost frame in code the reducer edits, and the tensors that reach it are probed just
    before it runs. `kept`: the probe `record` wrote (the run folder's launch_probe.json); when
    it still fits, those two runs of the whole script are not made again. `traceback`: the
    recorded run's, whose frames spare the run that reads them (while the script is as it was)."""
    script_path = Path(failure.script).resolve()
    cwd = Path(failure.cwd or script_path.parent).resolve()
    argv = list(failure.argv)
    editable = reducible_files(script_path, (script_path.parent, cwd))
    recorded = recorded_launch(kept, script_path, argv, editable)
    if recorded is not None:
        focus, launch = recorded.focus, recorded.specs
    else:
        focus, launch = _probe_failing_call(failure, script_path, cwd, argv, editable, traceback)
    if focus is not None:
        launch = with_value_ranges(launch, focus)
    specs = launch.args or tuple(report.spec for report in failure.tensors)
    return reduce_source(
        script_path,
        cwd=cwd,
        argv=argv,
        expected=failure.signature,
        oracle=oracle,
        max_checks=max_checks,
        max_time=max_time,
        on_event=on_event,
        specs=specs,
        named_specs=launch.params,
        named_values=launch.values,
        call_values=launch.launch,
        focus=focus,
        timeout=timeout,
        message=failure.error.message,  # how its numbers relate stays
    )


def recorded_launch(
    kept: Path | None, script_path: Path, argv: list[str], editable: set[Path]
) -> KeptLaunch | None:
    """The launch probe record kept, when it is for this script and a file the reducer edits."""
    if kept is None:
        return None
    recorded = kept_launch(kept, script_path, argv)
    if recorded is None or recorded.file.resolve() not in editable:
        return None
    return recorded


def _probe_failing_call(
    failure: Any,
    script_path: Path,
    cwd: Path,
    argv: list[str],
    editable: set[Path],
    traceback: str = "",
) -> tuple[str | None, LaunchSpecs]:
    """One run reads what reaches the innermost failing frame's call, and what reaches the
    nearest plain function's around it: when the innermost function cannot be called with what
    reached it (numpy arrays, `ctx`, `self`), that outer call is the one the jump cuts to
    (reprocut.source.call_frame)."""
    inner = _user_frames(failure, script_path, cwd, argv, editable, traceback)
    if not inner:
        return None, LaunchSpecs()
    file, line = inner[-1]
    focus = statement_text(file, line)
    if focus is None:
        return None, LaunchSpecs()
    targets = [(file, line, focus)]
    outer = outer_call_frame(inner[:-1])
    outer_focus = None if outer is None else statement_text(*outer)
    if outer is not None and outer_focus is not None and outer != (file, line):
        targets.append((*outer, outer_focus))
    probed = probe_launches(script_path, cwd=cwd, argv=argv, targets=targets)
    for (at, number, text), launch in zip(targets, probed, strict=True):
        if callable_with(at, number, launch):
            return text, launch
    return focus, probed[0]


def _user_frames(
    failure: Any,
    script_path: Path,
    cwd: Path,
    argv: list[str],
    editable: set[Path],
    traceback: str,
) -> list[tuple[Path, int]]:
    """The failing frames in files the reducer edits, outermost first: the recorded
    traceback's while it still fits the files, for a synchronous error (a CUDA error surfaces at
    a later call without the blocking launches the run reading them again has); else that run."""
    synchronous = failure.signature.error_code is None and failure.signature.error_type != "Crash"
    frames = traceback_frames(traceback) if synchronous else []
    if not any(file.resolve() in editable for file, _ in frames):
        frames = failing_frames(script_path, cwd=cwd, argv=argv)
    inner = [(file, line) for file, line in frames if file.resolve() in editable]
    crashed = failure.source if not frames and failure.signature.error_type == "Crash" else None
    if crashed is not None and Path(crashed.file).resolve() in editable:
        inner = [(Path(crashed.file), crashed.line)]  # no traceback: faulthandler's frame
    return inner


class _PinScriptDir(m.MatcherDecoratableTransformer):
    """`os.path.dirname(__file__)` and `Path(__file__).parent` -> the original script's folder."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    @m.leave(
        m.Call(
            func=m.Attribute(
                value=m.Attribute(value=m.Name("os"), attr=m.Name("path")), attr=m.Name("dirname")
            ),
            args=[m.Arg(m.Name("__file__"))],
        )
    )
    def _pin_dirname(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return cst.SimpleString(repr(self.directory))

    @m.leave(
        m.Attribute(
            value=m.Call(func=m.Name("Path"), args=[m.Arg(m.Name("__file__"))]),
            attr=m.Name("parent"),
        )
    )
    def _pin_parent(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return cst.Call(
            func=cst.Name("Path"), args=[cst.Arg(cst.SimpleString(repr(self.directory)))]
        )


def pin_script_dir(code: str, directory: Path) -> str:
    """A reduced script may still import the user's own extension beside the original, or one of
    their modules the reduction could not inline (one whose state the script sets): pinning
    its folder (and putting it on sys.path for such an import) keeps `python repro.py` working
    wherever the repro is written."""
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return code
    pinned = module.visit(_PinScriptDir(str(directory)))
    on_path = f"sys.path.insert(0, {str(directory)!r})"
    if sibling_imports(pinned, (directory,)) and on_path not in pinned.code:
        return with_script_dir_on_path(pinned.code, directory)
    return pinned.code


def with_script_dir_on_path(code: str, directory: Path) -> str:
    """The user's script as it runs from another folder: its sibling modules found where they
    are (`sys.path[0]` is the script's folder when Python runs it; the unshrunk candidate kept
    under accepted/ is not beside them)."""
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return code
    body = list(module.body)
    at = 0
    while at < len(body) and (
        m.matches(body[at], m.SimpleStatementLine([m.Expr(m.SimpleString())]))
        or m.matches(body[at], m.SimpleStatementLine([m.ImportFrom(module=m.Name("__future__"))]))
    ):
        at += 1
    lines = [cst.parse_statement("import sys\n"),
             cst.parse_statement(f"sys.path.insert(0, {str(directory)!r})\n")]  # fmt: skip
    return module.with_changes(body=[*body[:at], *lines, *body[at:]]).code
