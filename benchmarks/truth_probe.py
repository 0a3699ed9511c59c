"""Run one corpus script with a minimal, independent observer and print what really failed.

Used to check a case's ground truth without trusting reprocut's own recorder (a benchmark that
grades the tool with the tool's output would prove nothing). It runs the script in this process
with `runpy`, under a TorchDispatchMode that notes the innermost aten op that raised and a
TorchFunctionMode that notes the outermost public torch call that raised; an optimizer step hook
counts completed steps. Prints one JSON line (prefixed with PROBE_RESULT) and exits 0.

    python benchmarks/truth_probe.py [--no-ops] corpus/<case>/train.py [script args...]

`--no-ops` leaves out the dispatch mode (the costly part): no `op`, everything else the same.

CPU only: it never touches CUDA itself; a `--device cuda` run would just report what raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

MARKER = "PROBE_RESULT "
REPO = Path(__file__).resolve().parents[1]


class _Observer:
    """What raised: the innermost aten op, the outermost public call, and the step count."""

    def __init__(self) -> None:
        self.op: str | None = None
        self.public_call: str | None = None
        self.steps = 0


class _OpMode(TorchDispatchMode):
    def __init__(self, observer: _Observer) -> None:
        super().__init__()
        self.observer = observer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            if self.observer.op is None:  # innermost op raises first
                self.observer.op = str(func._schema.name)
            raise


class _CallMode(TorchFunctionMode):
    def __init__(self, observer: _Observer) -> None:
        super().__init__()
        self.observer = observer

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            self.observer.public_call = _public_name(func)
            raise


def _public_name(func: Any) -> str:
    from reprocut.model.publicapi import public_name

    return public_name(func) or _qualified_name(func)


def _qualified_name(func: Any) -> str:
    module = getattr(func, "__module__", None) or ""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if module.startswith("torch.nn.functional"):
        return f"torch.nn.functional.{name}"
    if "Tensor" in name or module == "torch._tensor":
        return f"torch.Tensor.{name.split('.')[-1]}"
    return f"torch.{name}" if not module or module.startswith("torch") else f"{module}.{name}"


def _user_frame(exc: BaseException, root: Path) -> tuple[str, int] | None:
    """The innermost traceback frame in a file under the case's folder."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(root):
            found = (str(path.relative_to(root)), frame.lineno or 0)
    return found


def probe(script: Path, argv: list[str], ops: bool = True) -> dict[str, Any]:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from reprocut.model.signature import classify

    observer = _Observer()

    def count_step(*_: Any) -> None:
        observer.steps += 1

    handle = register_optimizer_step_post_hook(count_step)
    root = script.parent.resolve()
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(root))
    result: dict[str, Any] = {"status": "passed", "steps": None}
    try:
        with _CallMode(observer), _OpMode(observer) if ops else contextlib.nullcontext():
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        result["exit_code"] = exc.code
    except Exception as exc:
        signature = classify(type(exc).__name__, str(exc), op=observer.op)
        location = _user_frame(exc, root)
        result = {
            "status": "failed",
            "error_type": type(exc).__name__,
            "message": str(exc).splitlines()[0] if str(exc) else "",
            "full_message": str(exc)[:4000],
            "error_code": getattr(exc, "error_code", None),
            "kind": signature.kind,
            "op": observer.op,
            "public_call": observer.public_call,
            "file": location[0] if location else None,
            "line": location[1] if location else None,
        }
    finally:
        handle.remove()
    result["steps"] = observer.steps
    return result


def main() -> None:
    args = sys.argv[1:]
    ops = args[:1] != ["--no-ops"]
    script, *argv = args if ops else args[1:]
    os.environ.setdefault("PYTHONHASHSEED", "0")
    result = probe(Path(script), argv, ops=ops)
    print(MARKER + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)  # after a sticky CUDA error, interpreter teardown can hang


if __name__ == "__main__":
    main()
