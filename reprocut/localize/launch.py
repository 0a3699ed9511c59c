"""A fault from outside PyTorch's dispatcher: a custom kernel launched from the user's code.

Also the launch inside a custom op: a `torch.library` op is dispatched like an aten op, so the
culprit's line is where the model calls it, but what faulted ran below, in the op's
implementation (a sibling module's kernel launch); `op_launch` finds that line.

Takes the outcome of the blocking rerun, whose line sync names the Python line that launched
the faulting kernel and whose reader kept what reached it (the run folder's launch probe file);
hands on the outside-dispatcher Failure, with the kernel's name and the tensors that reached the
launch. Only when the rerun could not read them does one more run, stopped at that line, read
them (`reprocut.source.probe.probe_launch`).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from reprocut.localize.failure import (
    LocalizeOptions,
    Progress,
    error_info,
    finish,
    location,
    signature_of,
)
from reprocut.localize.kernel_facts import kernel_facts
from reprocut.model.case import SourceLocation, TensorSpec
from reprocut.model.recording import Failure, TensorReport
from reprocut.record.inside.frames import deepest_below, user_frames_in
from reprocut.record.parent.runner import RunResult
from reprocut.report.diagnosis import DIAGNOSES, layout_facts
from reprocut.source.custom_ops import registering_file, user_files

MISALIGNED_CODE = 716  # cudaErrorMisalignedAddress


def outside_dispatcher(
    options: LocalizeOptions,
    first: RunResult,
    outcome: dict[str, Any],
    blocked: dict[str, Any],
    run: RunResult,
    progress: Progress,
) -> Failure:
    error = blocked.get("error", outcome["error"])
    launch = location(blocked.get("surfaced_at"))
    culprit = blocked.get("culprit") or {}
    kernel, tensors = None, ()
    if launch is not None:
        misaligned = error_info(error, run.stderr).code == MISALIGNED_CODE or (
            "misaligned address" in str(error.get("message", ""))
        )
        kernel, tensors = _launch_inputs(options, launch, progress, misaligned=misaligned)
    return finish(
        options,
        Failure(
            status="outside-dispatcher",
            error=error_info(error, run.stderr),
            signature=signature_of(error, run.stderr, None),
            step=blocked.get("step", outcome.get("step")),
            phase=blocked.get("phase"),
            module=culprit.get("module"),
            kernel=kernel,
            source=launch,
            surfaced_at=location(outcome.get("surfaced_at")),
            tensors=tensors,
            diagnosis=DIAGNOSES["layout"],
            localization="rerun",
            device="cuda",
            notes=(
                "the faulting kernel is not a PyTorch op: `reprocut shrink` reduces the script "
                "itself (source-level reduction)",
            ),
        ),
    )


def _launch_inputs(
    options: LocalizeOptions,
    launch: SourceLocation,
    progress: Progress = lambda _: None,
    *,
    misaligned: bool = False,
) -> tuple[str | None, tuple[TensorReport, ...]]:
    """The launched kernel's name and the tensors reaching the launch (those whose addresses
    reach it as integers too), with their layout facts and the facts their values show (ids
    against the table's rows, addresses, int32 offsets, misaligned rows): as the blocking rerun
    read them, else read by one more run stopped where the launch raises; nothing when they
    cannot be read."""
    from reprocut.source.focus import call_argument_sources, statement_text
    from reprocut.source.probe import kept_launch, probe_launch

    path = Path(launch.file)
    focus = statement_text(path, launch.line) if path.is_file() else None
    if focus is None:
        return None, ()
    kept = kept_launch(options.run_dir.launch_probe_path, options.script, options.argv)
    if kept is not None and kept.file == path.resolve() and kept.line == launch.line:
        probed = kept.specs  # the rerun that named the line read it
    else:
        progress(f"reading what reached the launch at {path.name}:{launch.line} (one more run)")
        probed = probe_launch(
            options.script,
            cwd=options.cwd,
            argv=options.argv,
            file=path,
            line=launch.line,
            focus=focus,
            timeout=options.timeout or 600.0,
            keep=options.run_dir.launch_probe_path,  # `shrink` reads it instead of probing again
        )
    named = [*zip(call_argument_sources(focus), probed.args, strict=False), *probed.params]
    tensors: dict[str, TensorSpec] = {}
    for name, spec in named:
        if spec is not None:
            tensors.setdefault(name, spec)
    values = kernel_facts(probed, list(tensors.items()), misaligned=misaligned)
    for pointer in probed.pointers:  # a tensor handed over by its address reaches it too
        if pointer.name in values:
            tensors.setdefault(pointer.name, pointer.spec)
    reports = [
        TensorReport(name, spec, (*layout_facts(spec), *values.get(name, ())))
        for name, spec in tensors.items()
    ]
    return probed.kernel, tuple(reports)


def op_launch(culprit: dict[str, Any], outcome: dict[str, Any]) -> SourceLocation | None:
    """The deepest line of the user's code below a custom op's call, where the error the op
    raised passed through its implementation (its kernel's launch); None for an aten op, or when
    the error did not pass through user code below the call (a fault that surfaced later)."""
    op, source = culprit.get("op") or "", location(culprit.get("source"))
    if source is None or "::" not in op or op.startswith(("aten::", "prims::")):
        return None
    found = deepest_below(user_frames_in(outcome.get("traceback") or ""), source)
    if found is None:  # under torch.compile the graph launches the kernel, not the op's code
        return registered_launch(op, Path(source.file))
    return location({"file": found.file, "line": found.line, "function": found.function})


def registered_launch(op: str, script: Path) -> SourceLocation | None:
    """The kernel launch written in the Python function registered as `op` (`@triton_op`,
    `@custom_op` with "ns::name"), in the script or a module of the user's it imports: under
    torch.compile the compiled graph launches the op's kernel itself, so no frame of the user's
    passes below the call, but the launch the user wrote for it is still that line (on the H200
    the report had no launch at all for a triton_op under compile)."""
    path = registering_file(op, user_files(script))
    if path is None:
        return None
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and _registers(function, op):
            launch = _first_launch(function)
            if launch is not None:
                return location({"file": str(path), "line": launch, "function": function.name})
    return None


def _registers(function: ast.FunctionDef, op: str) -> bool:
    """Decorated by a call whose first argument is the op's name (`@triton_op("ns::op", ...)`)."""
    return any(
        isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
        and d.args[0].value == op
        for d in function.decorator_list
    )  # fmt: skip


def _first_launch(function: ast.FunctionDef) -> int | None:
    """The line of the first Triton launch (`kernel[grid](...)`, `wrap_triton(kernel)[grid](...)`)
    or CuPy launch (`kernel(grid, block, args)` with tuples) in the function."""
    lines = [
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and (
            isinstance(node.func, ast.Subscript)
            or (len(node.args) == 3 and all(isinstance(a, ast.Tuple) for a in node.args[:2]))
        )
    ]
    return min(lines, default=None)
