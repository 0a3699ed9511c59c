"""From a failed run to the first faulting op, its real inputs and a Failure on disk.

The first run's traceback is not evidence on CUDA: errors surface asynchronously at a later op.
In order of cost:
1. in-process: the op raised synchronously (CPU, or a fault caught in a synchronized step);
2. snapshot replay: the asserting ops of the failing step, whose evidence was copied to host
   before they ran, are replayed one at a time in fresh children; the first that faults is it;
3. rerun: the script runs again to the failing step, synchronizing around each op of that step;
   a fault pending *before* an op came from outside the dispatcher, and a blocking rerun then
   names the Python line that launched the custom kernel.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from reprocut.model.case import (
    ArgList,
    ReproCase,
    Signature,
    SourceLocation,
    TensorSpec,
    arg_from_json,
)
from reprocut.model.errors import ScriptDidNotFailError, ScriptTimeoutError
from reprocut.model.recording import ErrorInfo, Failure, RunDir, TensorReport
from reprocut.model.signature import classify, cuda_error_code, is_cuda_failure, parse_assertions
from reprocut.model.tensors import materialize_arg
from reprocut.record.runner import RunRequest, RunResult, run_script
from reprocut.report.diagnosis import DIAGNOSES, explain, layout_facts

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class LocalizeOptions:
    script: Path
    argv: tuple[str, ...]
    run_dir: RunDir
    cwd: Path
    timeout: float | None = None
    launch_blocking: bool = False
    snapshots: bool = True
    rerun: bool = True
    oracle: Any = None  # a warmed-up Oracle for snapshot replay, if the caller made one


def environment_summary() -> dict[str, str]:
    """Versions only; never the user's environment variables (they may hold secrets)."""
    return {
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _location(data: dict[str, Any] | None) -> SourceLocation | None:
    """A location from the child, its line's text read from the file unless the child gave one
    (the end-of-script marker, a launch line read by line_sync)."""
    if not data:
        return None
    text = data.get("text", "")
    if not text:
        try:
            lines = Path(data["file"]).read_text().splitlines()
            text = lines[data["line"] - 1].strip()
        except (OSError, IndexError):
            pass
    return SourceLocation(data["file"], data["line"], text, data.get("function", ""))


def _error_info(error: dict[str, Any], stderr: str) -> ErrorInfo:
    code, name = cuda_error_code(error["message"])
    return ErrorInfo(
        type=error["type"],
        message=error["message"],
        code=error.get("code") if error.get("code") is not None else code,
        name=name,
        assertions=tuple(a.to_json() for a in parse_assertions(stderr)),
    )


def signature_of(error: dict[str, Any], stderr: str, op: str | None) -> Signature:
    return classify(error["type"], error["message"], stderr, op, error.get("code"))


def localize(options: LocalizeOptions, first: RunResult, progress: Progress) -> Failure:
    """Turn the first run's result into a Failure (written to the run dir), or raise."""
    outcome = first.outcome
    if first.timed_out:
        steps = sum(1 for r in options.run_dir.read_trace() if r.get("type") == "step")
        raise ScriptTimeoutError(
            f"the script ran past --timeout {options.timeout:g}s (completed {steps} step(s))",
            hint="raise --timeout if it is just slow; a hang after a CUDA error is common, and "
            "`reprocut record --launch-blocking` often turns it into a clean error",
        )
    if outcome is None:
        return _crashed(options, first, progress)
    if outcome["status"] in ("passed", "exited") and outcome.get("exit_code", 0) == 0:
        raise ScriptDidNotFailError(
            "the script finished without error: nothing to reproduce",
            hint="check the arguments (the failing epoch/step, the --device), or whether the "
            "failure is flaky",
        )
    if outcome["status"] == "exited":
        return _script_error(
            options,
            first,
            ErrorInfo("SystemExit", f"the script exited with code {outcome['exit_code']}"),
            None,
        )
    error = outcome["error"]
    culprit = outcome.get("culprit")
    cuda = is_cuda_failure(error["type"], error["message"], error.get("code"))
    if _names_op(culprit):
        return _from_culprit(options, first, outcome, culprit, first, "in-process")
    if not cuda and outcome.get("light_step") and options.rerun:
        return _rerun_for_op(options, first, outcome, progress)
    if _names_public_call(culprit):
        return _from_culprit(options, first, outcome, culprit, first, "in-process")
    if not cuda:
        return _script_error(options, first, _error_info(error, first.stderr), outcome)
    progress(f"CUDA error surfaced at step {outcome['step']}; finding the op that faulted")
    if options.snapshots and outcome.get("snapshots"):
        found = _replay_snapshots(options, first, outcome, progress)
        if found is not None:
            return found
    if not options.rerun:
        return _not_localized(options, first, outcome, "localization rerun disabled (--no-rerun)")
    return _rerun(options, first, outcome, progress)


def _rerun(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], progress: Progress
) -> Failure:
    step = outcome["step"]
    first_suspect = min(step, outcome.get("healthy_through", step - 1) + 1)
    span = f"step {step}" if first_suspect == step else f"steps {first_suspect}-{step}"
    progress(f"rerunning to {span}, synchronizing around each op there")
    second = _run_again(
        options,
        "localize",
        localize_from=first_suspect,
        localize_to=step,
        launch_blocking=options.launch_blocking,
    )
    again = second.outcome
    if again is None or again.get("status") != "failed":
        why = "it crashed" if again is None else "it did not fail"
        return _not_localized(
            options, first, outcome, f"the localization rerun to step {step}: {why}"
        )
    culprit = again.get("culprit")
    if _names_op(culprit):
        return _from_culprit(options, first, outcome, culprit, second, "rerun")
    # A fault pending before an aten op, or raised outside any: a custom kernel.
    progress(
        "the fault came from outside PyTorch's dispatcher; rerunning with CUDA_LAUNCH_BLOCKING=1, "
        "waiting for the GPU after each line of your code"
    )
    third = _run_again(options, "localize-blocking", launch_blocking=True, sync_lines=True)
    blocked = third.outcome if third.outcome and third.outcome.get("status") == "failed" else again
    used = third if blocked is third.outcome else second
    return _outside_dispatcher(options, first, outcome, blocked, used, progress)


def _run_again(options: LocalizeOptions, attempt: str, **how: Any) -> RunResult:
    """Run the script again for localization (no snapshots); `how` holds the RunRequest fields
    that make this attempt what it is (the steps to synchronize in, blocking launches, ...)."""
    return run_script(
        RunRequest(
            options.script,
            options.argv,
            options.run_dir.path,
            attempt,
            snapshots=False,
            timeout=options.timeout,
            cwd=options.cwd,
            **how,
        )
    )


def _names_op(culprit: dict[str, Any] | None) -> bool:
    """The child saw an aten op raise with all earlier work known complete: that op is it."""
    return bool(culprit and culprit.get("op") and culprit["synchronized"])


def _names_public_call(culprit: dict[str, Any] | None) -> bool:
    """No aten op raised, but a composite public call's own check did (F.one_hot's)."""
    return bool(culprit and culprit.get("public_call") and culprit["synchronized"])


def _rerun_for_op(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], progress: Progress
) -> Failure:
    """A synchronous error in a light step, where only asserting ops are watched: the step is
    run again under the dispatch mode to name the op that raised, if any did."""
    step = outcome["step"]
    progress(
        f"an error at step {step}, which recorded only the ops that can device-assert; "
        "rerunning that step watching every op"
    )
    second = _run_again(options, "localize", localize_from=step, localize_to=step)
    again = second.outcome
    culprit = again.get("culprit") if again else None
    if _names_op(culprit):
        return _from_culprit(options, first, outcome, culprit, second, "rerun")
    known = outcome.get("culprit")
    if _names_public_call(known):
        return _from_culprit(options, first, outcome, known, first, "in-process")
    return _script_error(options, first, _error_info(outcome["error"], first.stderr), outcome)


def _replay_snapshots(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], progress: Progress
) -> Failure | None:
    """Replay the failing step's asserting ops from their host snapshots, in order."""
    try:
        from reprocut.check.oracle import Oracle
    except ImportError:
        return None
    inputs = _load_inputs(options.run_dir)
    snapshots = rank_snapshots(outcome["snapshots"], inputs)
    progress(f"replaying up to {len(snapshots)} asserting op(s) from snapshots, likeliest first")
    oracle = options.oracle or Oracle(timeout=options.timeout or 60.0)
    try:
        for snapshot in snapshots:
            case = _case(
                snapshot["target"], snapshot["call"], None, snapshot["op"], snapshot.get("source")
            )
            verdict = oracle.check_case(case, inputs)
            signature = getattr(verdict, "signature", None)
            if signature is not None and signature.error_code is not None:
                culprit = {**snapshot, "synchronized": True, "forward_source": None}
                return _from_culprit(
                    options,
                    first,
                    outcome,
                    culprit,
                    first,
                    "snapshot-replay",
                    signature=replace(signature, op=snapshot["op"]),
                    replay_stderr=getattr(verdict, "stderr", ""),
                    inputs=inputs,
                )
    finally:
        if options.oracle is None:
            oracle.close()
    return None


def rank_snapshots(snapshots: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """Snapshots whose captured evidence already shows a violation first, then in run order.

    A replay costs a process; reading the captured indices costs nothing. The host copies of ops
    queued after the fault may hold garbage, so evidence only orders the checks: a replay decides.
    """

    def violates(snapshot: dict[str, Any]) -> bool:
        try:
            tensors, _ = _explain({**snapshot, "synchronized": True}, inputs)
        except Exception:
            return False
        return any(
            "≥" in fact or "<" in fact or "NaN" in fact or "outside" in fact
            for row in tensors
            for fact in row.facts
            if not fact.startswith("all ")
        )

    flagged = [s for s in snapshots if violates(s)]
    return flagged + [s for s in snapshots if s not in flagged]


def _case(
    target: str,
    call: dict[str, Any],
    expected: Signature | None,
    op: str | None,
    source: dict[str, Any] | None,
) -> ReproCase:
    return ReproCase(
        target=target,
        args=tuple(arg_from_json(a) for a in call["args"]),
        kwargs=tuple((k, arg_from_json(v)) for k, v in call["kwargs"] if _plain(v)),
        expected=expected,
        aten_op=op,
        source=_location(source),
        inputs_file="inputs.pt",
    )


def _plain(value: Any) -> bool:
    return not (isinstance(value, dict) and "unsupported" in value)


def _load_inputs(run_dir: RunDir) -> dict[str, torch.Tensor]:
    if not run_dir.inputs_path.exists():
        return {}
    return torch.load(run_dir.inputs_path, weights_only=True)


def _from_culprit(
    options: LocalizeOptions,
    first: RunResult,
    outcome: dict[str, Any],
    culprit: dict[str, Any],
    localized_run: RunResult,
    method: str,
    *,
    signature: Signature | None = None,
    replay_stderr: str = "",
    inputs: dict[str, torch.Tensor] | None = None,
) -> Failure:
    error_run = localized_run.outcome or outcome
    error = error_run["error"] if "error" in error_run else outcome["error"]
    stderr = replay_stderr or localized_run.stderr
    op = culprit.get("op") or culprit.get("public_call")
    if signature is None:
        signature = signature_of(error, stderr, op)
    cases: list[ReproCase] = []
    if culprit.get("public_call") and culprit.get("public"):
        cases.append(
            _case(
                culprit["public_call"],
                culprit["public"],
                signature,
                culprit.get("op"),
                culprit.get("source"),
            )
        )
    if culprit.get("target") and culprit.get("call"):
        cases.append(
            _case(
                culprit["target"],
                culprit["call"],
                signature,
                culprit.get("op"),
                culprit.get("source"),
            )
        )
    if inputs is None:  # snapshot replay has them loaded already
        inputs = _load_inputs(options.run_dir)
    tensors, diagnosis = _explain(culprit, inputs)
    device = _device_of(cases)
    notes = []
    if outcome.get("compiled"):
        notes.append("torch.compile was used; the script ran eagerly for localization")
    first_error = outcome["error"]
    return _finish(
        options,
        Failure(
            status="localized",
            error=_error_info(error, stderr)
            if method != "snapshot-replay"
            else _merge_replay(first_error, first.stderr, stderr),
            signature=signature,
            op=culprit.get("op"),
            public_call=culprit.get("public_call"),
            step=culprit.get("step"),
            phase=culprit.get("phase"),
            module=culprit.get("module"),
            source=_location(culprit.get("source")),
            forward_source=_location(culprit.get("forward_source")),
            surfaced_at=_location(outcome.get("surfaced_at")),
            tensors=tensors,
            diagnosis=diagnosis,
            localization=method,
            device=device,
            cases=tuple(cases),
            notes=tuple(notes),
        ),
    )


def _merge_replay(first_error: dict[str, Any], first_stderr: str, replay_stderr: str) -> ErrorInfo:
    info = _error_info(first_error, first_stderr or replay_stderr)
    if not info.assertions:
        info = replace(info, assertions=tuple(a.to_json() for a in parse_assertions(replay_stderr)))
    return info


def _device_of(cases: list[ReproCase]) -> str:
    for case in cases:
        for _, spec in case.tensors():
            if spec.device != "cpu":
                return spec.device
    return "cpu"


def _explain(
    culprit: dict[str, Any], inputs: dict[str, torch.Tensor]
) -> tuple[tuple[TensorReport, ...], str]:
    """Tensor table + diagnosis, from the aten call if known, else the public call."""
    use_public = not culprit.get("call")
    call = culprit.get("public") if use_public else culprit.get("call")
    if not call:
        return (), DIAGNOSES["layout"] if culprit.get("op") is None else ""
    raw_args = [arg_from_json(a) for a in call["args"]]
    raw_kwargs = {k: arg_from_json(v) for k, v in call["kwargs"] if _plain(v)}
    try:
        values = [materialize_arg(on_cpu(a), inputs) for a in raw_args]
        kw_values = {k: materialize_arg(on_cpu(v), inputs) for k, v in raw_kwargs.items()}
        explanation = explain(
            None if use_public else culprit.get("op"), culprit.get("public_call"), values, kw_values
        )
        if not any(explanation.facts.values()) and culprit.get("public") and not use_public:
            public_args = [
                materialize_arg(on_cpu(arg_from_json(a)), inputs) for a in culprit["public"]["args"]
            ]
            explanation = explain(None, culprit.get("public_call"), public_args, {})
    except Exception as exc:  # explaining is best effort: never lose the recording over it
        return _table(
            raw_args, raw_kwargs, {}, call.get("names", ())
        ), f"(could not analyse the inputs: {exc})"
    return _table(
        raw_args, raw_kwargs, explanation.facts, call.get("names", ())
    ), explanation.diagnosis


def on_cpu(arg: Any) -> Any:
    """The same argument with every tensor on the CPU: this process never touches CUDA."""
    if isinstance(arg, TensorSpec):
        return replace(arg, device="cpu")
    if isinstance(arg, ArgList):
        return ArgList(tuple(on_cpu(item) for item in arg.items))
    return arg


def _table(
    args: list[Any],
    kwargs: dict[str, Any],
    facts: dict[int | str, tuple[str, ...]],
    names: Sequence[str] = (),
) -> tuple[TensorReport, ...]:
    rows = []
    for position, arg in enumerate(args):
        if isinstance(arg, TensorSpec):
            name = names[position] if position < len(names) else f"arg{position}"
            rows.append(TensorReport(name, arg, facts.get(position, ())))
        elif isinstance(arg, ArgList):
            name = names[position] if position < len(names) else f"arg{position}"
            for index, item in enumerate(arg.items):
                if isinstance(item, TensorSpec):
                    key = f"{position}[{index}]"
                    rows.append(TensorReport(f"{name}[{index}]", item, facts.get(key, ())))
    for name, arg in kwargs.items():
        if isinstance(arg, TensorSpec):
            rows.append(TensorReport(name, arg, facts.get(name, ())))
    return tuple(rows)


def _finish(options: LocalizeOptions, failure: Failure) -> Failure:
    failure = replace(
        failure,
        script=str(options.script),
        argv=options.argv,
        cwd=str(options.cwd),
        env=environment_summary(),
    )
    options.run_dir.write_failure(failure)
    return failure


def _script_error(
    options: LocalizeOptions, first: RunResult, error: ErrorInfo, outcome: dict[str, Any] | None
) -> Failure:
    surfaced = _location(outcome.get("surfaced_at")) if outcome else None
    return _finish(
        options,
        Failure(
            status="script-error",
            error=error,
            signature=classify(error.type, error.message),
            step=outcome.get("step") if outcome else None,
            phase=outcome.get("phase") if outcome else None,
            source=surfaced,
            surfaced_at=surfaced,
            localization="in-process",
            notes=("the script failed, but not inside a torch op",),
        ),
    )


def _not_localized(
    options: LocalizeOptions, first: RunResult, outcome: dict[str, Any], why: str
) -> Failure:
    error = outcome["error"]
    hint = (
        ""
        if options.launch_blocking
        else "; try `reprocut record --launch-blocking`, or make the script deterministic (seeds)"
    )
    return _finish(
        options,
        Failure(
            status="not-localized",
            error=_error_info(error, first.stderr),
            signature=signature_of(error, first.stderr, outcome.get("last_op")),
            step=outcome.get("step"),
            phase=outcome.get("phase"),
            surfaced_at=_location(outcome.get("surfaced_at")),
            source=_location(outcome.get("surfaced_at")),
            localization="none",
            notes=(f"the first run failed, but {why}{hint}",),
        ),
    )


def _outside_dispatcher(
    options: LocalizeOptions,
    first: RunResult,
    outcome: dict[str, Any],
    blocked: dict[str, Any],
    run: RunResult,
    progress: Progress,
) -> Failure:
    error = blocked.get("error", outcome["error"])
    launch = _location(blocked.get("surfaced_at"))
    culprit = blocked.get("culprit") or {}
    kernel, tensors = None, ()
    if launch is not None:
        progress(f"reading what reached the launch at {Path(launch.file).name}:{launch.line}")
        kernel, tensors = _launch_inputs(options, launch)
    return _finish(
        options,
        Failure(
            status="outside-dispatcher",
            error=_error_info(error, run.stderr),
            signature=signature_of(error, run.stderr, None),
            step=blocked.get("step", outcome.get("step")),
            phase=blocked.get("phase"),
            module=culprit.get("module"),
            kernel=kernel,
            source=launch,
            surfaced_at=_location(outcome.get("surfaced_at")),
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
    options: LocalizeOptions, launch: SourceLocation
) -> tuple[str | None, tuple[TensorReport, ...]]:
    """The launched kernel's name and the tensors reaching the launch, with their layout facts,
    read by one more run stopped where the launch raises (`reprocut.source.probe.probe_launch`);
    nothing when they cannot be read."""
    from reprocut.source.probe import call_argument_sources, probe_launch, statement_text

    path = Path(launch.file)
    focus = statement_text(path, launch.line) if path.is_file() else None
    if focus is None:
        return None, ()
    probed = probe_launch(
        options.script,
        cwd=options.cwd,
        argv=options.argv,
        file=path,
        line=launch.line,
        focus=focus,
        timeout=options.timeout or 600.0,
    )
    named = [*zip(call_argument_sources(focus), probed.args, strict=False), *probed.params]
    reports: dict[str, TensorReport] = {}
    for name, spec in named:
        if spec is not None and name not in reports:
            reports[name] = TensorReport(name, spec, layout_facts(spec))
    return probed.kernel, tuple(reports.values())


def _crashed(options: LocalizeOptions, first: RunResult, progress: Progress) -> Failure:
    steps = [r for r in options.run_dir.read_trace() if r.get("type") == "step"]
    completed = len(steps)
    how = f"signal {first.signal}" if first.signal else f"exit code {first.returncode}"
    assertions = parse_assertions(first.stderr)
    message = f"the script's process died ({how}) after {completed} completed step(s)"
    error = ErrorInfo(
        type="Crash", message=message, assertions=tuple(a.to_json() for a in assertions)
    )
    if assertions and options.rerun:
        progress(f"{message}; kernel assertions on stderr: rerunning to step {completed}")
        fake_outcome = {
            "step": completed,
            "error": {"type": "Crash", "message": message},
            "snapshots": [],
        }
        return _rerun(options, first, fake_outcome, progress)
    return _finish(
        options,
        Failure(
            status="not-localized",
            error=error,
            signature=Signature("Crash", None, None, how),
            step=completed,
            localization="none",
            notes=(f"the trace holds the {completed} completed step(s) before the crash",),
        ),
    )
