"""The user's own loop counters at the failure: `epoch=0, step=41`, as the user counts steps.

reprocut counts optimizer steps, which is not how people count: a failure after
`optimizer.step()` in iteration 40 is in reprocut's step 41, and a DQN whose optimizer starts
after a warm-up is 16 steps behind its loop. So at the failure the `for` statements enclosing
the executing line of each of the user's frames are found in the file's AST, and their integer
targets read from the frame's locals (`for epoch in range(...)`, `for step, batch in
enumerate(loader)`: epoch and step; batch is no integer). A `while` loop counts too, by the
names its test compares that its body increments (`while step < n: ... step += 1`: step), the
shape of a counter that spans epochs.

A failure after the training loop has ended (in `generate()` after 3000 iterations) is in no
step: `TrainingLoop` notes the user's frames at each optimizer step, and the loop enclosing
the step's line; a failure whose frames are all outside that loop came after it.
"""

from __future__ import annotations

import ast
import linecache
import numbers
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType, TracebackType

from reprocut.record.inside.frame_locals import local_values
from reprocut.record.inside.frames import UserFrames

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
Loop = ast.For | ast.AsyncFor | ast.While


class _FileLoops:
    """The `for` and `while` statements of one file, each with the scope it runs in."""

    def __init__(self, source: str) -> None:
        self.loops: list[tuple[Loop, ast.AST | None]] = []
        self.scopes: list[ast.AST] = []
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        self._visit(tree, None)

    def _visit(self, node: ast.AST, scope: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES):
                self.scopes.append(child)
                self._visit(child, child)
                continue
            if isinstance(child, _LOOPS):
                self.loops.append((child, scope))
            self._visit(child, scope)

    def targets_at(self, line: int) -> tuple[str, ...]:
        """Names bound by the loops whose body holds `line`, outermost first, in the scope that
        runs `line` (a loop of an enclosing function is that function's frame's business)."""
        names: list[str] = []
        for loop in self.enclosing(line):
            names.extend(n for n in _counters_of(loop) if n not in names)
        return tuple(names)

    def enclosing(self, line: int) -> list[Loop]:
        """The loops whose body holds `line` (not the header: the iterator is running), in the
        scope that runs `line`, outermost first."""
        scope = None
        for candidate in self.scopes:
            end = getattr(candidate, "end_lineno", None) or candidate.lineno
            if candidate.lineno <= line <= end and (
                scope is None or candidate.lineno > scope.lineno
            ):
                scope = candidate
        return [
            loop
            for loop, loop_scope in self.loops
            if loop_scope is scope
            and loop.body
            and _body_span(loop)[0] <= line <= _body_span(loop)[1]
        ]


def _body_span(loop: Loop) -> tuple[int, int]:
    """First and last line of a loop's body."""
    last = loop.body[-1]
    return loop.body[0].lineno, getattr(last, "end_lineno", None) or last.lineno


def _counters_of(loop: Loop) -> list[str]:
    if isinstance(loop, ast.While):
        return while_counters(loop)
    return _names(loop.target)


def while_counters(loop: ast.While) -> list[str]:
    """The names a `while` loop's test compares that its body increments or decrements
    (`x += k`, `x -= k`, `x = x + k`), in the order the test names them."""
    compared: list[str] = []
    for node in ast.walk(loop.test):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Name) and side.id not in compared:
                    compared.append(side.id)
    stepped = _stepped_names(loop.body)
    return [name for name in compared if name in stepped and not name.startswith("_")]


def _stepped_names(body: list[ast.stmt]) -> set[str]:
    """Names the statements add to or subtract from (nested scopes left out)."""
    stepped: set[str] = set()
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, _SCOPES):
            continue
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(node.op, (ast.Add, ast.Sub))
        ):
            stepped.add(node.target.id)
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.BinOp)
            and isinstance(node.value.op, (ast.Add, ast.Sub))
        ):
            operands = (node.value.left, node.value.right)
            for target in node.targets:
                if isinstance(target, ast.Name) and any(
                    isinstance(o, ast.Name) and o.id == target.id for o in operands
                ):
                    stepped.add(target.id)
        pending.extend(ast.iter_child_nodes(node))
    return stepped


def _names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [] if target.id.startswith("_") else [target.id]  # `for _ in ...` counts nothing
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _names(element)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return []  # attributes and subscripts are not counters


class LoopCounters:
    """Reads the integer counters of the user's enclosing loops (ASTs cached per file)."""

    def __init__(self, frames: UserFrames) -> None:
        self.frames = frames
        self.training = TrainingLoop(self)  # whether the training loop had ended
        self._files: dict[str, _FileLoops] = {}
        self._targets: dict[tuple[CodeType, int], tuple[str, ...]] = {}

    def read(self, frame: FrameType | None) -> dict[str, int]:
        """The counters of every user frame from `frame` outward, outermost loop first."""
        stack: list[tuple[FrameType, int]] = []
        while frame is not None:
            if self.frames.is_user(frame.f_code):
                stack.append((frame, frame.f_lineno))
            frame = frame.f_back
        return self._counters(reversed(stack))

    def from_view(self, user: list[tuple[FrameType, int]]) -> dict[str, int]:
        """The counters of a StackView's user frames (innermost first there)."""
        return self._counters(reversed(user))

    def from_traceback(self, tb: TracebackType | None) -> dict[str, int]:
        """The counters of the user frames a traceback passed through (outermost first)."""
        stack: list[tuple[FrameType, int]] = []
        while tb is not None:
            if self.frames.is_user(tb.tb_frame.f_code):
                stack.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        return self._counters(stack)

    def _counters(self, stack: object) -> dict[str, int]:
        counters: dict[str, int] = {}
        for frame, line in stack:  # type: ignore[attr-defined]
            names = self._targets_of(frame.f_code, line)
            if not names:
                continue
            values = local_values(frame)
            for name in names:
                value = values.get(name)
                if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                    continue
                key = name if name not in counters else f"{frame.f_code.co_name}.{name}"
                counters[key] = int(value)
        return counters

    def _targets_of(self, code: CodeType, line: int) -> tuple[str, ...]:
        key = (code, line)
        names = self._targets.get(key)
        if names is None:
            names = self._targets[key] = self.file_loops(code).targets_at(line)
        return names

    def file_loops(self, code: CodeType) -> _FileLoops:
        """The loops of the file `code` is in (parsed once)."""
        loops = self._files.get(code.co_filename)
        if loops is None:
            source = "".join(linecache.getlines(code.co_filename))
            loops = self._files[code.co_filename] = _FileLoops(source)
        return loops


Site = tuple[CodeType, int]  # a user frame: its code and the line it runs


class TrainingLoop:
    """Whether a failure came after the training loop had ended.

    At each optimizer step the user's frames are noted (their code and line: no frame is
    kept alive). The training loop is the innermost loop around the step's line in the
    deepest user frame that has one, from its header on (fetching the next batch is in it); a
    failure none of whose frames runs a line of that loop came after it (a `generate()` after
    the last step), and is in no step. Asked where the step is reported: at each snapshot and
    culprit (a stack view or frame), and at the error (its traceback)."""

    def __init__(self, counters: LoopCounters) -> None:
        self.counters = counters
        self.step_sites: tuple[Site, ...] = ()  # the last optimizer step's, outermost first
        self._found: tuple[tuple[Site, ...], tuple[CodeType, int, int] | None] = ((), None)

    def note_step(self, frame: FrameType | None) -> None:
        """An optimizer step ended, called from `frame`'s user code."""
        self.step_sites = tuple(reversed(self._sites(frame)))

    def after_frame(self, frame: FrameType | None) -> dict[str, str | None] | None:
        """`{"function": "generate"}` when the code running `frame` came after the training
        loop (the user's function it ran in, None at the loop's own level); None when it ran
        inside it, or no step or loop was seen."""
        return self._after(lambda: list(reversed(self._sites(frame))))

    def after_view(self, user: list[tuple[FrameType, int]]) -> dict[str, str | None] | None:
        """The same for a StackView's user frames (innermost first)."""
        return self._after(lambda: [(frame.f_code, line) for frame, line in reversed(user)])

    def after_traceback(self, tb: TracebackType | None) -> dict[str, str | None] | None:
        """The same for the user frames an error's traceback passed through."""

        def sites() -> list[Site]:
            found, at = [], tb
            while at is not None:
                if self.counters.frames.is_user(at.tb_frame.f_code):
                    found.append((at.tb_frame.f_code, at.tb_lineno))
                at = at.tb_next
            return found

        return self._after(sites)

    def _sites(self, frame: FrameType | None) -> list[Site]:
        """The user frames from `frame` outward (innermost first)."""
        sites: list[Site] = []
        while frame is not None:
            if self.counters.frames.is_user(frame.f_code):
                sites.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        return sites

    def _after(self, read: Callable[[], list[Site]]) -> dict[str, str | None] | None:
        loop = self._loop()
        if loop is None:  # before the first step, or no loop around it (a framework's)
            return None
        failed = read()  # outermost first
        if failed and threading.current_thread() is not threading.main_thread():
            # autograd's engine runs a GPU backward on threads of its own: the loop's line is
            # on the main thread, blocked in `loss.backward()` (a custom Function's backward
            # at step 5 had read as "after the training loop" on the H200)
            failed = [*self._main_sites(), *failed]
        code, first, last = loop
        if not failed or any(c is code and first <= line <= last for c, line in failed):
            return None
        return {"function": _function_after(self.step_sites, failed)}

    def _main_sites(self) -> list[Site]:
        """The main thread's user frames, outermost first."""
        main = threading.main_thread().ident
        frame = sys._current_frames().get(main) if main is not None else None
        return list(reversed(self._sites(frame)))

    def _loop(self) -> tuple[CodeType, int, int] | None:
        """The training loop: the code running it, its header's line and its body's last."""
        sites, found = self._found
        if sites is self.step_sites:
            return found
        found = None
        for code, line in reversed(self.step_sites):
            around = self.counters.file_loops(code).enclosing(line)
            if around:
                found = (code, around[-1].lineno, _body_span(around[-1])[1])
                break
        self._found = (self.step_sites, found)
        return found


def _function_after(stepped: tuple[Site, ...], failed: list[Site]) -> str | None:
    """The user's function the failure ran in, below the frames it shares with the step."""
    shared = 0
    while shared < min(len(stepped), len(failed)) and (
        stepped[shared][0] is failed[shared][0] and stepped[shared][1] == failed[shared][1]
    ):
        shared += 1
    if shared < len(failed) and (
        shared >= len(stepped) or failed[shared][0] is not stepped[shared][0]
    ):
        below = failed[shared][0]  # another function (or cell) than the step's
    elif shared + 1 < len(failed):
        below = failed[shared + 1][0]  # called from the loop's function, after the loop
    else:
        return None
    return None if below.co_name.startswith("<") else below.co_name
