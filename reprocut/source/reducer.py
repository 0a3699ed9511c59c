"""Reduce the user's own script while it still fails with the same signature.

For faults the dispatcher never sees (Triton, CuPy, C++/CUDA extensions, a user's own helper),
there is no aten op to rebuild, so the program itself is cut down: the same fixed-point loop as
the op-level shrinker, over module texts instead of ReproCases. One total order (`sort_key`)
says which script is simpler; `consider` is the only place `best` changes, checking "strictly
smaller" before paying for a run and "same signature" after; each accepted script goes out
through `on_event` so the caller can save it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as m
import libcst.metadata

from reprocut.model.case import Signature, TensorSpec, spec_from_json
from reprocut.model.errors import NotReproducedError
from reprocut.source.passes import (
    COMPOUND,
    PASSES,
    PassContext,
    SourcePass,
    calls_focus,
    focus_callee,
    import_module_name,
    integer_value,
    is_constant,
    parse,
    sibling_file,
    sibling_imports,
)

# check(code) -> a Verdict from reprocut.check.oracle (anything with `.signature` that failed), or,
# for pure predicates and the fresh-process check here, the Signature seen (None: it passed).
Check = Callable[[str], Any]


# --- the size order --------------------------------------------------------------------------


class _Measure(cst.CSTVisitor):
    """Counts for the size order. A tensor built from literals counts as one node."""

    def __init__(self) -> None:
        self.compound = self.small = self.nodes = self.names = self.integers = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, COMPOUND):
            self.compound += 1
        elif isinstance(node, cst.BaseSmallStatement):
            self.small += 1
        if isinstance(node, cst.BaseExpression | cst.Arg):
            self.nodes += 1
            if is_constant(node) and isinstance(node, cst.Call):
                return False
        if isinstance(node, cst.Name):
            self.names += 1
        elif isinstance(node, cst.Integer):
            self.integers += integer_value(node)
        return True


def sort_key(code: str, search_dirs: Sequence[Path] = ()) -> tuple[int, ...]:
    """Smaller is simpler: imports of the user's own modules (a repro is one file), then
    blocks (loops, branches, functions: a flat script is simpler), non-blank lines, statements,
    expression nodes, variable names, the sum of integer constants, characters."""
    module = parse(code)
    if module is None:
        return (sys.maxsize,)
    measure = _Measure()
    module.visit(measure)
    lines = sum(1 for line in code.splitlines() if line.strip())
    return (
        len(sibling_imports(module, search_dirs)) if search_dirs else 0,
        measure.compound,
        lines,
        measure.small,
        measure.nodes,
        measure.names,
        measure.integers,
        len(code),
    )


# --- results and events ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceAccepted:
    """A smaller script that still fails the same way (the caller may save it)."""

    pass_name: str
    code: str
    lines: int
    checks: int


@dataclass(frozen=True, slots=True)
class SourceChecked:
    """One candidate was run."""

    pass_name: str
    checks: int
    accepted: bool


SourceEvent = SourceAccepted | SourceChecked


@dataclass(frozen=True, slots=True)
class SourceResult:
    code: str
    statements: int
    lines: int
    checks: int
    seconds: float
    accepted: tuple[tuple[str, int], ...]  # (pass name, accepted candidates), passes in order
    stopped: str  # "fixed point", "max checks", "max time"
    original_lines: int = 0


def count_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def count_small_statements(code: str) -> int:
    module = parse(code)
    if module is None:
        return 0
    measure = _Measure()
    module.visit(measure)
    return measure.small + measure.compound


# --- the loop --------------------------------------------------------------------------------


class _OutOfBudget(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def signature_of(verdict: Any) -> Signature | None:
    """The failure a check saw: a Verdict's signature, a bare Signature, or None (passed)."""
    if verdict is None or isinstance(verdict, Signature):
        return verdict
    signature = getattr(verdict, "signature", None)
    return signature if isinstance(signature, Signature) else None


def reproduces(verdict: Any, expected: Signature) -> bool:
    """Same bug? The oracle's Verdict says so itself (Reproduced); a bare Signature from a
    plain check is compared with `expected`."""
    if isinstance(verdict, Signature):
        return verdict.matches(expected)
    if verdict is None:
        return False
    from reprocut.check.oracle import Reproduced

    return isinstance(verdict, Reproduced)


@dataclass
class SourceReducer:
    """Greedy reduction to a fixed point; `best` changes only in `consider`."""

    best: str
    expected: Signature
    check: Check
    context: PassContext
    passes: Sequence[SourcePass] = PASSES
    max_checks: int = 500
    max_time: float = 300.0
    on_event: Callable[[SourceEvent], None] | None = None
    checks: int = 0  # runs paid for so far (the caller may count its initial check)
    started: float = field(default_factory=time.monotonic)
    accepted: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set, repr=False)

    def key(self, code: str) -> tuple[int, ...]:
        return sort_key(code, self.context.search_dirs)

    def drops_focus(self, candidate: str) -> bool:
        """Would the candidate lose the failing call (the launch) the best still makes? A repro
        must keep calling the kernel or helper that failed, not re-raise its error by hand."""
        focus = self.context.focus
        return bool(calls_focus(self.best, focus)) and calls_focus(candidate, focus) is False

    def is_same_failure(self, verdict: Any) -> bool:
        return reproduces(verdict, self.expected)

    def consider(self, candidate: str, pass_name: str = "") -> bool:
        if candidate in self.seen or self.key(candidate) >= self.key(self.best):
            return False  # no run for a repeat or a non-improvement
        if self.drops_focus(candidate):
            return False
        if self.checks >= self.max_checks:
            raise _OutOfBudget("max checks")
        if time.monotonic() - self.started >= self.max_time:
            raise _OutOfBudget("max time")
        self.seen.add(candidate)
        self.checks += 1
        ok = self.is_same_failure(self.check(candidate))
        self._emit(SourceChecked(pass_name, self.checks, ok))
        if not ok:
            return False
        self.best = candidate
        self.accepted[pass_name] = self.accepted.get(pass_name, 0) + 1
        self._emit(SourceAccepted(pass_name, candidate, count_lines(candidate), self.checks))
        return True

    def run_pass(self, source_pass: SourcePass) -> None:
        name = source_pass.__name__
        generator = source_pass(self.best, self.context)
        try:
            candidate = next(generator)
            while True:
                candidate = generator.send(self.consider(candidate, name))
        except StopIteration:
            return
        finally:
            generator.close()

    def run(self) -> str:
        """Run every pass until a whole round changes nothing; the reason it stopped."""
        try:
            while True:
                before = self.best
                for source_pass in self.passes:
                    self.run_pass(source_pass)
                if self.best == before:
                    return "fixed point"
        except _OutOfBudget as exc:
            return exc.reason

    def _emit(self, event: SourceEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)


def reduce_source(
    script_path: Path,
    *,
    cwd: Path,
    argv: Sequence[str],
    expected: Signature,
    check: Check | None = None,
    oracle: Any = None,
    max_checks: int = 500,
    max_time: float = 300,
    on_event: Callable[[SourceEvent], None] | None = None,
    specs: Sequence[TensorSpec | None] = (),
    named_specs: Sequence[tuple[str, TensorSpec]] = (),
    named_values: Sequence[tuple[str, Any]] = (),
    focus: str | None = None,
    passes: Sequence[SourcePass] = PASSES,
    timeout: float = 60.0,
    code: str | None = None,
) -> SourceResult:
    """Cut `script_path` down to a small standalone script failing with `expected`.

    `check(code)` runs a candidate; without one, `oracle.check_source` does (an Oracle with its
    fork server is started, and stopped at the end, when none is given).
    `specs` are the tensors recorded at the failing call by argument position (`focus`: that
    line's text) and `named_specs` the tensor parameters of the function making it,
    `named_values` its plain ones (see `probe_launch`): they may replace what computed them,
    strides and storage offsets kept.
    Raises NotReproducedError when the script does not fail that way to begin with.
    """
    script_path = Path(script_path).resolve()
    cwd = Path(cwd).resolve()
    original = script_path.read_text() if code is None else code
    with contextlib.ExitStack() as stack:
        if check is None:
            if oracle is None:
                from reprocut.check.oracle import Oracle  # the fork server: torch imported once

                oracle = stack.enter_context(Oracle(expected, timeout=timeout))
            check = _oracle_check(oracle, script_path, cwd, list(argv), expected, timeout)
            stack.callback(candidate_path(script_path).unlink, missing_ok=True)
        return _reduce(
            original,
            script_path=script_path,
            cwd=cwd,
            expected=expected,
            check=check,
            max_checks=max_checks,
            max_time=max_time,
            on_event=on_event,
            specs=specs,
            named_specs=named_specs,
            named_values=named_values,
            focus=focus,
            passes=passes,
        )


def _reduce(
    original: str,
    *,
    script_path: Path,
    cwd: Path,
    expected: Signature,
    check: Check,
    max_checks: int,
    max_time: float,
    on_event: Callable[[SourceEvent], None] | None,
    specs: Sequence[TensorSpec | None],
    named_specs: Sequence[tuple[str, TensorSpec]],
    named_values: Sequence[tuple[str, Any]],
    focus: str | None,
    passes: Sequence[SourcePass],
) -> SourceResult:
    started = time.monotonic()
    context = PassContext(
        search_dirs=tuple(dict.fromkeys((script_path.parent, cwd))),
        specs=tuple(specs),
        named_specs=tuple(named_specs),
        named_values=tuple(named_values),
        focus=focus,
    )
    if not reproduces(check(original), expected):
        raise NotReproducedError(
            f"{script_path.name} does not fail with {expected.describe()}",
            hint="record it again: the failure may depend on the environment or be flaky",
        )
    reducer = SourceReducer(
        best=original,
        expected=expected,
        check=check,
        context=context,
        passes=passes,
        max_checks=max_checks,
        max_time=max_time,
        on_event=on_event,
        checks=1,
        started=started,
    )
    stopped = reducer.run()
    final = reducer.best
    for finish in (ending_with_a_sync, format_code):
        finished = finish(final)
        if finished != final:
            reducer.checks += 1
            if reproduces(check(finished), expected):
                final = finished
    return SourceResult(
        code=final,
        statements=count_small_statements(final),
        lines=count_lines(final),
        checks=reducer.checks,
        seconds=time.monotonic() - started,
        accepted=tuple((p.__name__, reducer.accepted.get(p.__name__, 0)) for p in passes),
        stopped=stopped,
        original_lines=count_lines(original),
    )


def ending_with_a_sync(code: str) -> str:
    """A GPU repro ends by waiting for the GPU: a fault still queued when `python repro.py`
    ends surfaces only at teardown (CuPy's module unload, say) with exit status 0, or not at
    all. The code as it is when it uses no GPU or already waits."""
    if "cuda" not in code or "torch.cuda.synchronize()" in code:
        return code
    module = parse(code)
    if module is None:
        return code
    wait = cst.parse_statement("torch.cuda.synchronize()\n")
    body = [*module.body, wait]
    if not any(m.matches(s, m.SimpleStatementLine([m.Import([m.ImportAlias(m.Name("torch"))])]))
               for s in module.body):  # fmt: skip
        future = sum(1 for s in module.body if m.matches(s, m.SimpleStatementLine(
            [m.ImportFrom(module=m.Name("__future__"))])))  # fmt: skip
        body.insert(future, cst.parse_statement("import torch\n"))
    return module.with_changes(body=body).code


def format_code(code: str) -> str:
    """ruff-formatted code when ruff is installed, else the code as it is."""
    ruff = shutil.which("ruff")
    command = [ruff, "format", "--isolated", "-"] if ruff else None
    if command is None:
        return code
    try:
        done = subprocess.run(command, input=code, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return code
    return done.stdout if done.returncode == 0 and done.stdout.strip() else code


# --- checks ----------------------------------------------------------------------------------


def candidate_path(script_path: Path) -> Path:
    """Where candidates are written: beside the script, so `__file__`, `sys.path[0]` and
    `inspect.getsource` (which `@triton.jit` reads) all see the candidate, not the original."""
    return script_path.with_name(f".reprocut-candidate-{script_path.name}")


def _oracle_check(
    oracle: Any, script_path: Path, cwd: Path, argv: list[str], expected: Signature, timeout: float
) -> Check:
    """Each candidate runs as `python script.py argv...` from `cwd` would run it, in a child."""
    path = candidate_path(script_path)

    def check(code: str) -> Any:
        path.write_text(code)
        return oracle.check_source(
            code,
            filename=str(path),
            cwd=cwd,
            argv=argv,
            timeout=timeout,
            sys_path0=str(script_path.parent),
            expected=expected,
        )

    return check


# --- what reaches the failing call -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaunchSpecs:
    """The tensors at the failing call, seen just before it ran: its arguments by position
    (None: not a tensor), the tensor parameters of the function making it, and that function's
    plain parameters (numbers, strings, tuples of them) with their values."""

    args: tuple[TensorSpec | None, ...] = ()
    params: tuple[tuple[str, TensorSpec], ...] = ()
    values: tuple[tuple[str, Any], ...] = ()
    kernel: str | None = None  # the launched kernel's own name (`cmvn_vec4`, not `_KERNEL`)


_PROBE = r"""
import json, os, sys, threading
result_path, filename, target_file, first, last, sources, launched = sys.argv[1:8]
sys.argv = [filename, *sys.argv[8:]]
sys.path[0] = os.path.dirname(os.path.abspath(filename))
target_file, sources = os.path.realpath(target_file), json.loads(sources)
first, last = int(first), int(last)
latest = None  # what reached the call the last time it was about to run

def spec(value):
    import torch
    from reprocut.model.case import spec_to_json
    from reprocut.model.tensors import spec_of
    return spec_to_json(spec_of(value)) if isinstance(value, torch.Tensor) else None

def kernel_name(frame):
    try:
        kernel = eval(launched, frame.f_globals, frame.f_locals)
    except Exception:
        return None
    for name in (getattr(kernel, "name", None), getattr(kernel, "__name__", None),
                 getattr(getattr(kernel, "fn", None), "__name__", None)):
        if isinstance(name, str):
            return name  # CuPy RawKernel.name, a function's or Triton JITFunction's name
    return None

def seen(frame):
    found = {"args": [], "params": [], "kernel": kernel_name(frame) if launched else None}
    for source in sources:
        try:
            found["args"].append(spec(eval(source, frame.f_globals, frame.f_locals)))
        except Exception:
            found["args"].append(None)
    found["values"] = []
    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        described = spec(value)
        if described is not None:
            found["params"].append([name, described])
        elif plain(value):
            found["values"].append([name, value])
    return found

def plain(value):
    if isinstance(value, tuple):
        return all(plain(v) for v in value)
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    return value is None or isinstance(value, (bool, int, str))

def report(found):
    if found is not None:
        with open(result_path, "w") as handle:
            json.dump(found, handle)
    os._exit(0)  # nothing is torn down: a faulted CUDA context must not hang the exit

def at_line(frame, event, arg):
    global latest
    if event == "line" and frame.f_lineno == first:
        latest = seen(frame)
    elif event == "exception" and first <= frame.f_lineno <= last:
        report(latest)  # this call raised: these are the tensors that made it fail
    return at_line

mine = {}

def on_call(frame, event, arg):
    name = frame.f_code.co_filename
    hit = mine.get(name)
    if hit is None:
        hit = mine[name] = os.path.realpath(name) == target_file
    return at_line if hit else None

sys.settrace(on_call)
threading.settrace(on_call)
with open(filename) as handle:
    code = compile(handle.read(), filename, "exec")
try:
    exec(code, {"__name__": "__main__", "__file__": filename})
finally:
    report(latest)  # it failed elsewhere (or not at all): the last call is the best guess
"""


def probe_launch(
    script_path: Path,
    *,
    cwd: Path,
    argv: Sequence[str],
    file: Path,
    line: int,
    focus: str,
    timeout: float = 600.0,
) -> LaunchSpecs:
    """Run the script under a line tracer and read the specs of the tensors reaching the failing
    call at `file:line` (`focus`: its text) the time it raised; the last time it ran when it
    never raised there.

    For custom kernels the recording knows only the launch line; this finds what the kernel was
    given (an expand()ed or offset view included), at the step that faulted, not the first.
    Launches are blocking, so an asynchronous fault raises at its call. Empty when the line is
    never reached.
    """
    from reprocut.check.oracle import child_environment

    sources = call_argument_sources(focus)
    span = statement_span(Path(file), line)
    first, last = (line, line) if span is None else span[1:]
    with tempfile.TemporaryDirectory(prefix="reprocut-probe-") as tmp:
        result = Path(tmp) / "specs.json"
        command = [sys.executable, "-c", _PROBE, str(result), str(script_path), str(file),
                   str(first), str(last), json.dumps(sources), launched_source(focus) or "",
                   *argv]  # fmt: skip
        try:
            subprocess.run(
                command,
                cwd=cwd,
                env=child_environment(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return LaunchSpecs()
        try:
            found = json.loads(result.read_text())
        except (OSError, ValueError):
            return LaunchSpecs()
    return LaunchSpecs(
        args=tuple(None if s is None else spec_from_json(s) for s in found["args"]),
        params=tuple((name, spec_from_json(s)) for name, s in found["params"]),
        values=tuple((name, _tuples(value)) for name, value in found.get("values", ())),
        kernel=found.get("kernel"),
    )


def _tuples(value: Any) -> Any:
    """JSON wrote the probed tuples as lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


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
    try:
        statement = cst.parse_statement(focus.strip() + "\n")
    except cst.ParserSyntaxError:
        return []
    calls = [c for c in m.findall(statement, m.Call()) if isinstance(c, cst.Call)]
    if not calls:
        return []
    module = cst.Module(body=[])
    return [module.code_for_node(a.value) for a in calls[0].args if a.keyword is None]


# --- from a recording ------------------------------------------------------------------------

_FRAMES = r"""
import json, os, sys, traceback
result_path, filename = sys.argv[1:3]
sys.argv = [filename, *sys.argv[3:]]
sys.path[0] = os.path.dirname(os.path.abspath(filename))
frames = []
try:
    with open(filename) as handle:
        code = compile(handle.read(), filename, "exec")
    exec(code, {"__name__": "__main__", "__file__": filename})
except BaseException as exc:
    frames = [[f.filename, f.lineno] for f in traceback.extract_tb(exc.__traceback__)]
with open(result_path, "w") as handle:
    json.dump(frames, handle)
os._exit(0)
"""


def failing_frames(
    script_path: Path, *, cwd: Path, argv: Sequence[str], timeout: float = 600.0
) -> list[tuple[Path, int]]:
    """The traceback of one fresh run of the script, outermost frame first (empty if it passed)."""
    from reprocut.check.oracle import child_environment

    with tempfile.TemporaryDirectory(prefix="reprocut-frames-") as tmp:
        result = Path(tmp) / "frames.json"
        try:
            subprocess.run(
                [sys.executable, "-c", _FRAMES, str(result), str(script_path), *argv],
                cwd=cwd,
                env=child_environment(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
                start_new_session=True,
            )
            frames = json.loads(result.read_text())
        except (subprocess.TimeoutExpired, OSError, ValueError):
            return []
    return [(Path(file), line) for file, line in frames]


def reducible_files(script_path: Path, search_dirs: Sequence[Path]) -> set[Path]:
    """The script and the sibling modules it imports: the code the reducer edits."""
    files = {script_path.resolve()}
    module = parse(script_path.read_text())
    if module is not None:
        for line in sibling_imports(module, search_dirs):
            name = import_module_name(line.body[0])
            path = None if name is None else sibling_file(name, search_dirs)
            if path is not None:
                files.add(path.resolve())
    return files


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


def reduce_recorded(
    failure: Any,
    *,
    oracle: Any = None,
    max_checks: int = 500,
    max_time: float = 300,
    on_event: Callable[[SourceEvent], None] | None = None,
    timeout: float = 60.0,
) -> SourceResult:
    """`reduce_source` for a recording (`reprocut.model.recording.Failure`): the failing call is the
    innermost frame in code the reducer edits (one fresh run finds it), and the tensors that
    reach it are probed just before it runs."""
    script_path = Path(failure.script).resolve()
    cwd = Path(failure.cwd or script_path.parent).resolve()
    argv = list(failure.argv)
    editable = reducible_files(script_path, (script_path.parent, cwd))
    frames = failing_frames(script_path, cwd=cwd, argv=argv)
    inner = [(file, line) for file, line in frames if file.resolve() in editable]
    focus, launch = None, LaunchSpecs()
    if inner:
        file, line = inner[-1]
        focus = statement_text(file, line)
        if focus is not None:
            launch = probe_launch(
                script_path, cwd=cwd, argv=argv, file=file, line=line, focus=focus
            )
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
        focus=focus,
        timeout=timeout,
    )


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
    """A reduced script may still import the user's own extension beside the original; pinning
    its folder keeps `python repro.py` working wherever the repro is written."""
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return code
    return module.visit(_PinScriptDir(str(directory))).code
