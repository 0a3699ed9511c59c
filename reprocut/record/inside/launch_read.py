"""What reached a custom kernel's launch, read from the live frame that made it.

A Triton, CuPy or extension kernel checks nothing it is handed: its tensors' layouts, the range
of its integer tensors, the plain numbers of the launch and the raw pointers among them are the
evidence (reprocut.localize.kernel_facts turns them into facts). Two runs read them with this
code: the blocking rerun that names the launch line (LineSync hands `LaunchReader` the launch's
frame once the fault shows, so no run of its own is needed), and the source reducer's probe
(reprocut.source.probe), which stops a fresh run at a line already known.

A fault is sticky: once it shows, the device answers nothing more. So the rerun reads integer
tensors' values while the device is still healthy, as each line of the user's code is about to
run (`RangeCache.note`), and at the fault only what the host holds (shapes, strides, pointers,
plain values), evaluating only expressions that launch no work (`evaluate_safe`). The probe
stops before the launch runs: it may evaluate and read everything (`evaluate_any`,
`integer_range`).
"""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

MISSING = object()  # an expression that could not be evaluated
MAX_POINTERS = 64  # tensors whose pointers one reading keeps (a frame rarely holds more)

Evaluate = Callable[[str, FrameType], Any]
Integers = Callable[[Any], dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class LaunchCall:
    """The launch line taken apart: the source of each positional argument and keyword, the
    grid of a `kernel[grid](...)` launch, and the object called (`add_kernel`)."""

    sources: tuple[str, ...] = ()
    keywords: tuple[tuple[str, str], ...] = ()
    grid: str | None = None
    launched: str | None = None

    @classmethod
    def from_focus(cls, focus: str) -> LaunchCall:
        from reprocut.source.focus import (  # libcst: loaded only when a launch is read
            call_argument_sources,
            call_keyword_sources,
            launch_grid_source,
            launched_source,
        )

        return cls(tuple(call_argument_sources(focus)), tuple(call_keyword_sources(focus)),
                   launch_grid_source(focus), launched_source(focus))  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "keywords": [list(k) for k in self.keywords],
                "grid": self.grid, "launched": self.launched}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchCall:
        return cls(tuple(data["sources"]), tuple((k, v) for k, v in data["keywords"]),
                   data.get("grid"), data.get("launched"))  # fmt: skip


def read_frame(
    frame: FrameType, call: LaunchCall, *, evaluate: Evaluate, integers: Integers
) -> dict[str, Any]:
    """What reaches the call in `frame`, as JSON (`reprocut.source.launch_specs` reads it): the
    arguments' specs and plain values, the function's tensor and plain parameters, integer
    tensors' ranges, the kernel's name and library, and the pointer of every tensor the frame
    holds (an integer argument equal to one is that tensor's address, not a number)."""
    import torch

    kernel = evaluate(call.launched, frame) if call.launched else MISSING
    library = None if kernel is MISSING else type(kernel).__module__.split(".")[0]
    found: dict[str, Any] = {"args": [], "params": [], "integers": [], "values": [],
                             "kernel": None if kernel is MISSING else kernel_name(kernel)}  # fmt: skip
    launch: dict[str, Any] = {"args": [], "keywords": [], "grid": None, "library": library}
    tensors: dict[str, Any] = {}
    for source in call.sources:
        value = evaluate(source, frame)
        value = None if value is MISSING else value
        found["args"].append(spec_json(value))
        launch["args"].append(scalar(value))
        counted = integers(value)
        if counted is not None:
            found["integers"].append([source, counted])
        if isinstance(value, torch.Tensor):
            tensors.setdefault(source, value)
    for name, source in call.keywords:
        value = evaluate(source, frame)
        launch["keywords"].append([name, None if value is MISSING else scalar(value)])
    if call.grid:
        grid = evaluate(call.grid, frame)
        launch["grid"] = None if grid is MISSING or callable(grid) else scalar(grid)
    found["launch"] = launch
    code = frame.f_code
    held = frame.f_locals
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = held.get(name)
        described = spec_json(value)
        if described is not None:
            found["params"].append([name, described])
            counted = None if name in call.sources else integers(value)  # read once
            if counted is not None:
                found["integers"].append([name, counted])
        elif plain(value):
            found["values"].append([name, value])
    for name, value in held.items():
        if isinstance(value, torch.Tensor):
            tensors.setdefault(name, value)
    found["pointers"] = [p for p in (pointer_json(n, t) for n, t in tensors.items()) if p][
        :MAX_POINTERS
    ]
    return found


# --- values, one at a time --------------------------------------------------------------------


def spec_json(value: Any) -> dict[str, Any] | None:
    import torch

    from reprocut.model.case import spec_to_json
    from reprocut.model.tensors import spec_of

    return spec_to_json(spec_of(value)) if isinstance(value, torch.Tensor) else None


def pointer_json(name: str, tensor: Any) -> dict[str, Any] | None:
    """Where a strided tensor's data starts and its storage's bytes: host-held numbers, read
    after a fault too."""
    import torch

    if tensor.layout != torch.strided:
        return None
    try:
        storage = tensor.untyped_storage()
        return {"name": name, "address": tensor.data_ptr(), "storage": storage.data_ptr(),
                "bytes": storage.nbytes(), "spec": spec_json(tensor)}  # fmt: skip
    except (RuntimeError, NotImplementedError):  # meta, functional or fake tensors
        return None


def kernel_name(kernel: Any) -> str | None:
    for name in (getattr(kernel, "name", None), getattr(kernel, "__name__", None),
                 getattr(getattr(kernel, "fn", None), "__name__", None)):  # fmt: skip
        if isinstance(name, str):
            return name  # CuPy RawKernel.name, a function's or Triton JITFunction's name
    return None


def scalar(value: Any) -> Any:
    """A plain launch value: an int (numpy's too), a float, a tuple of them; else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (list, tuple)):
        return [scalar(v) for v in value[:16]]
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if type(value).__module__.startswith("numpy"):
        try:
            return operator.index(value)
        except TypeError:
            return None
    return value if isinstance(value, int) else None


def plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(plain(v) for v in value)
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    return value is None or isinstance(value, (bool, int, str))


def is_integer_tensor(value: Any) -> bool:
    import torch

    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and value.numel() > 0
        and not (value.dtype.is_floating_point or value.dtype.is_complex)
        and value.dtype != torch.bool
    )


def integer_range(value: Any) -> dict[str, Any] | None:
    """The smallest and largest value of an integer tensor and where (flat), read from it now:
    the device must still be healthy."""
    import torch

    if not is_integer_tensor(value):
        return None
    try:
        flat = value.detach().reshape(-1).to(torch.int64)
        return {"low": int(flat.min()), "high": int(flat.max()), "low_at": int(flat.argmin()),
                "high_at": int(flat.argmax()), "shape": list(value.shape)}  # fmt: skip
    except Exception:
        return None


# --- evaluating the launch's arguments --------------------------------------------------------


def evaluate_any(source: str, frame: FrameType) -> Any:
    """Any expression, before the launch runs (the probe's way)."""
    try:
        return eval(source, frame.f_globals, frame.f_locals)
    except Exception:
        return MISSING


# calls that read what the host holds or wrap a value: no kernel runs, nothing changes
_READING_METHODS = frozenset({"data_ptr", "stride", "size", "numel", "dim", "storage_offset",
                              "element_size", "item_size", "is_contiguous"})  # fmt: skip
_WRAPPERS = frozenset({"int", "float", "len", "asarray", "from_dlpack", "fromDlpack", "cdiv",
                       "int8", "int16", "int32", "int64", "uint32", "uint64", "intp",
                       "float16", "float32", "float64"})  # fmt: skip
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.LShift: operator.lshift,
               ast.RShift: operator.rshift, ast.BitAnd: operator.and_, ast.BitOr: operator.or_}  # fmt: skip


def evaluate_safe(source: str, frame: FrameType) -> Any:
    """An expression after the fault: names, attributes, constants, tuples, indexing by a
    constant, arithmetic on integers, and calls that only read (`x.data_ptr()`, `x.stride(0)`,
    `cupy.asarray(x)`, `np.int32(n)`); anything else (`model(x)`, `x * 2`) is not run."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        return MISSING
    try:
        return _value(tree.body, frame)
    except Exception:
        return MISSING


def _value(node: ast.expr, frame: FrameType) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        for scope in (frame.f_locals, frame.f_globals, frame.f_builtins):
            if node.id in scope:
                return scope[node.id]
        raise NameError(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_value(node.value, frame), node.attr)
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_value(e, frame) for e in node.elts)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return _value(node.value, frame)[node.slice.value]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_integer(_value(node.operand, frame))
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _integer(_value(node.left, frame)), _integer(_value(node.right, frame))
        return _ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, ast.Call) and not node.keywords:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else None
        name = node.func.id if isinstance(node.func, ast.Name) else name
        if name in _READING_METHODS or name in _WRAPPERS:
            function = _value(node.func, frame)
            return function(*(_value(a, frame) for a in node.args))
    raise ValueError(f"not evaluated after a fault: {ast.unparse(node)}")


def _integer(value: Any) -> int:
    return operator.index(value)  # a tensor or a float is not taken: no work runs for it


# --- the rerun's reader -----------------------------------------------------------------------


class RangeCache:
    """Integer tensors' ranges, read as the user's lines are about to run (the device healthy
    then), kept per tensor while it lives and its version holds."""

    def __init__(self, limit: int = 256) -> None:
        self._ranges: dict[int, tuple[Any, int, dict[str, Any] | None]] = {}
        self._limit = limit

    def note(self, frame: FrameType) -> None:
        """Read the ranges of the integer tensors `frame` holds that changed since last seen."""
        for value in frame.f_locals.values():
            if is_integer_tensor(value):
                self._remember(value)

    def _remember(self, tensor: Any) -> dict[str, Any] | None:
        kept = self._kept(tensor)
        if kept is not MISSING:
            return kept
        counted = integer_range(tensor)
        if len(self._ranges) >= self._limit:
            self._ranges.pop(next(iter(self._ranges)))
        self._ranges[id(tensor)] = (weakref.ref(tensor), _version(tensor), counted)
        return counted

    def _kept(self, tensor: Any) -> Any:
        kept = self._ranges.get(id(tensor))
        if kept is not None and kept[0]() is tensor and kept[1] == _version(tensor):
            return kept[2]
        return MISSING

    def read(self, value: Any) -> dict[str, Any] | None:
        """The range noted for `value`; a CPU tensor's is read now (it outlives a CUDA fault),
        a device tensor not seen before has none."""
        if not is_integer_tensor(value):
            return None
        kept = self._kept(value)
        if kept is not MISSING:
            return kept
        return self._remember(value) if value.device.type == "cpu" else None


def _version(tensor: Any) -> int:
    """The tensor's version counter; an inference tensor keeps none (-1: taken as unchanged)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return -1


class LaunchReader:
    """The rerun's reader: notes integer ranges as lines run, and once the fault shows, reads
    the launch's frame into the run folder's launch probe file, as `probe_launch(keep=...)`
    writes it (`reprocut.source.probe.kept_launch` reads either)."""

    def __init__(self, path: Path, script: str, argv: list[str]) -> None:
        self.path, self.script, self.argv = path, script, argv
        self.ranges = RangeCache()

    def note(self, frame: FrameType) -> None:
        with contextlib.suppress(Exception):  # a reading never changes how the script runs
            self.ranges.note(frame)

    def at_fault(self, frame: FrameType, line: int) -> bool:
        """Read what reached the call at `line` of `frame` and write it; False when it cannot
        be read (`record` then probes in a run of its own)."""
        try:
            from reprocut.source.focus import statement_text

            file = Path(frame.f_code.co_filename).resolve()
            focus = statement_text(file, line)
            if focus is None:
                return False
            found = read_frame(frame, LaunchCall.from_focus(focus), evaluate=evaluate_safe,
                               integers=self.ranges.read)  # fmt: skip
            kept = {"script": str(Path(self.script).resolve()), "argv": self.argv,
                    "file": str(file), "line": line, "focus": focus, "found": found,
                    "read_by": "rerun"}  # fmt: skip
            self.path.write_text(json.dumps(kept))
            return True
        except Exception:
            return False
