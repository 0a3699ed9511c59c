"""Which frame of the failing stack the reduction cuts to: a function its probed values can call.

The jump to the failing call (reprocut.source.passes.jump) binds the probed tensors and values
to the parameters of the function making the call and runs its body up to it: one check in
place of the training run. That needs a function every parameter of which is probed or has a
default. The innermost frame in the user's code is not always one: a numpy "kernel" takes
arrays (not probed as tensors), an autograd.Function's `forward` takes `ctx`, a module's
method `self`. The nearest frame around it that is a plain function of tensors (the wrapper
that calls `Function.apply`) is then the call to cut to. Read with `ast` from the file: no run.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from reprocut.source.launch_specs import LaunchSpecs


@dataclass(frozen=True, slots=True)
class Enclosing:
    """The function a line is in: its parameters (with whether each has a default) and
    whether it is defined at the module's top level (not a method, not nested)."""

    name: str
    params: tuple[tuple[str, bool], ...]
    top_level: bool


def enclosing_function(file: Path, line: int) -> Enclosing | None:
    """The innermost function whose body holds `line` (None: module level, or unreadable)."""
    tree = _parsed(str(file))
    if tree is None:
        return None
    found: tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool] | None = None
    stack: list[tuple[ast.AST, bool]] = [(node, True) for node in tree.body]
    while stack:
        node, top = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end:
                found = (node, top)
                stack.extend((child, False) for child in node.body)
        elif isinstance(node, ast.ClassDef):
            stack.extend((child, False) for child in node.body)
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            stack.extend((child, top) for child in ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend((child, top) for child in node.body)
    if found is None:
        return None
    function, top = found
    return Enclosing(function.name, _params(function.args), top)


def _params(args: ast.arguments) -> tuple[tuple[str, bool], ...]:
    positional = [*args.posonlyargs, *args.args]
    defaulted = len(positional) - len(args.defaults)
    named = [(a.arg, i >= defaulted) for i, a in enumerate(positional)]
    named += [
        (a.arg, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return tuple(named)


@lru_cache(maxsize=32)
def _parsed(path: str) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None


def callable_with(file: Path, line: int, launch: LaunchSpecs) -> bool:
    """Can the jump call the function making the call at `file:line` with what was probed
    there: a top-level function with a probed tensor, every parameter probed or defaulted?"""
    function = enclosing_function(file, line)
    if function is None or not function.top_level or not launch.params:
        return False
    probed = {name for name, _ in launch.params} | {name for name, _ in launch.values}
    return all(name in probed or default for name, default in function.params)


def outer_call_frame(frames: Sequence[tuple[Path, int]]) -> tuple[Path, int] | None:
    """The nearest frame (`frames` outermost first, the innermost left out) in a top-level
    function that takes parameters: where a jump may cut to when the innermost frame's function
    cannot be called with what reached it."""
    for file, line in reversed(frames):
        function = enclosing_function(file, line)
        if function is not None and function.top_level and function.params:
            return file, line
    return None
