"""From a culprit the child named to a localized Failure with its repro cases.

Takes the culprit JSON (the faulting aten op and/or public call, its recorded call, step, phase,
module and source lines), the outcome of the run it came from and the run's saved inputs; hands
on the Failure with one ReproCase per recorded call (the public call's first, then the aten
op's), its inputs explained, written to the run dir. The checks for whether a culprit names an
op at all live here too: every strategy asks them before calling `from_culprit`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from reprocut.localize.explain import explain_inputs, plain
from reprocut.localize.failure import LocalizeOptions, error_info, finish, location, signature_of
from reprocut.localize.launch import op_launch
from reprocut.model.after_loop import AfterLoop
from reprocut.model.case import ReproCase, Signature, arg_from_json
from reprocut.model.failing_test import placed
from reprocut.model.publicapi import composite_op
from reprocut.model.recording import ErrorInfo, Failure, RunDir
from reprocut.model.signature import device_in_words, parse_assertions
from reprocut.record.parent.runner import RunResult


def names_op(culprit: dict[str, Any] | None) -> bool:
    """The child saw an aten op raise with all earlier work known complete: that op is it."""
    return bool(culprit and culprit.get("op") and culprit["synchronized"])


def names_public_call(culprit: dict[str, Any] | None) -> bool:
    """No aten op raised, but a composite public call's own check did (F.one_hot's)."""
    return bool(culprit and culprit.get("public_call") and culprit["synchronized"])


def repro_case(
    target: str,
    call: dict[str, Any],
    expected: Signature | None,
    op: str | None,
    source: dict[str, Any] | None,
) -> ReproCase:
    return ReproCase(
        target=target,
        args=tuple(arg_from_json(a) for a in call["args"]),
        kwargs=tuple((k, arg_from_json(v)) for k, v in call["kwargs"] if plain(v)),
        expected=expected,
        aten_op=op,
        source=location(source),
        inputs_file="inputs.pt",
    )


def load_inputs(run_dir: RunDir) -> dict[str, torch.Tensor]:
    if not run_dir.inputs_path.exists():
        return {}
    return torch.load(run_dir.inputs_path, weights_only=True)


def from_culprit(
    options: LocalizeOptions,
    first: RunResult,
    outcome: dict[str, Any],
    culprit: dict[str, Any],
    localized_run: RunResult,
    method: str,
    *,
    signature: Signature | None = None,
    replay_stderr: str = "",
    replay_error: dict[str, Any] | None = None,
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
            repro_case(
                culprit["public_call"],
                culprit["public"],
                signature,
                culprit.get("op"),
                culprit.get("source"),
            )
        )
    if culprit.get("target") and culprit.get("call"):
        cases.append(
            repro_case(
                culprit["target"],
                culprit["call"],
                signature,
                culprit.get("op"),
                culprit.get("source"),
            )
        )
    if inputs is None:  # snapshot replay has them loaded already
        inputs = load_inputs(options.run_dir)
    tensors, diagnosis = explain_inputs(culprit, inputs, str(error.get("message") or ""))
    device = _device_of(cases, error)
    notes = []
    named_op = culprit.get("op") or composite_op(culprit.get("public_call"))
    if named_op and not culprit.get("op"):
        notes.append(
            f"no dispatched op raised: {named_op} is CompositeImplicitAutograd (it runs as "
            f"other ops), so {culprit['public_call']}'s own check raised"
        )
    if outcome.get("compiled"):
        notes.append("torch.compile was used; the script ran eagerly for localization")
    first_error = outcome["error"]
    # the training loop had ended: read by the child where the culprit's op ran (a snapshot's
    # too: its error surfaced later, maybe after the loop although its op ran in it)
    after = AfterLoop.from_outcome(culprit, culprit.get("step"))
    test = placed(options.test, (localized_run.outcome or {}).get("test"), culprit.get("test_line"))
    return finish(
        replace(options, test=test),
        Failure(
            status="localized",
            error=error_info(error, stderr)
            if method != "snapshot-replay"
            else _merge_replay(first_error, first.stderr, stderr, replay_error),
            signature=signature,
            op=named_op,
            public_call=culprit.get("public_call"),
            step=None if after else culprit.get("step"),
            after_loop=after,
            phase=culprit.get("phase"),
            module=culprit.get("module"),
            source=location(culprit.get("source")),
            forward_source=location(culprit.get("forward_source")),
            call_site=location(culprit.get("call_site")),
            launch=op_launch(culprit, error_run),
            loop=dict(culprit.get("loop") or {}),
            surfaced_at=location(outcome.get("surfaced_at")),
            tensors=tensors,
            diagnosis=diagnosis,
            localization=method,
            device=device,
            cases=tuple(cases),
            notes=tuple(notes),
        ),
    )


def _merge_replay(
    first_error: dict[str, Any],
    first_stderr: str,
    replay_stderr: str,
    replay_error: dict[str, Any] | None = None,
) -> ErrorInfo:
    """The run's error, with the kernel assertions the replay printed where the run printed
    none. Where the run's error names no CUDA error, or another one (on the H100 a device assert
    of `nll_loss` surfaced as the next matmul's CUBLAS_STATUS_EXECUTION_FAILED), the replayed
    op's own error is the error, and what the script saw is kept as `surfaced_as`."""
    info = error_info(first_error, first_stderr or replay_stderr)
    replayed = replay_error or {}
    if replayed.get("code") is not None and info.code != replayed["code"]:
        own = error_info(replayed, replay_stderr)
        seen = {"type": first_error["type"], "message": first_error["message"]}
        return replace(own, surfaced_as=seen)
    if not info.assertions:
        info = replace(info, assertions=tuple(a.to_json() for a in parse_assertions(replay_stderr)))
    return info


def _device_of(cases: list[ReproCase], error: dict[str, Any]) -> str:
    """The device of the culprit's inputs; with none captured (an OOM's inputs too big to
    keep), a CUDA error's own words say cuda (a cuBLAS workspace failure read as "cpu" hid
    the allocator's fragmentation figures)."""
    for case in cases:
        for _, spec in case.tensors():
            if spec.device != "cpu":
                return spec.device
    return device_in_words(str(error.get("type") or ""), str(error.get("message") or ""))
