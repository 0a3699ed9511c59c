"""Where a NaN or inf came from: rerun to its step, check every op there, hand on the origin.

Takes the first run's outcome: with `--nan`, the first step whose non-finite flag flipped
(record/inside/nonfinite.py); otherwise a Failure whose culprit's inputs held NaN or inf, or
whose own message talks about it, and its step. Reruns the script to that step with finite checks
around every op (record/inside/finite_watch.py); when a step before it flipped in that rerun,
reruns that one.
Hands on a NonfiniteOrigin (op, step, phase, line, module, autograd node, facts, chain, and how
the first run ended): attached to the Failure as it was, or, with `--nan`, as the Failure
itself, whose case is the producing op ending in a finite check.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from typing import Any

import torch

from reprocut.localize.culprit import repro_case
from reprocut.localize.explain import _table, on_cpu, plain
from reprocut.localize.failure import LocalizeOptions, Progress, finish, location, not_localized
from reprocut.localize.rerun import _run_again
from reprocut.model.case import ReproCase, arg_from_json
from reprocut.model.nonfinite import BORN, ENTERED, FROM_INF, Ended, Link, NonfiniteOrigin
from reprocut.model.recording import ErrorInfo, Failure, TensorReport
from reprocut.model.signature import NONFINITE_ERROR, NONFINITE_MESSAGE, nonfinite_signature
from reprocut.model.tensors import materialize_arg
from reprocut.record.inside.child import NONFINITE_INPUTS_FILE
from reprocut.record.inside.nonfinite import GRACE_STEPS
from reprocut.record.parent.runner import RunResult
from reprocut.report.nonfinite import DIAGNOSES, family, nonfinite_facts

MENTIONS_NONFINITE = re.compile(r"\bnan\b|\binf\b|infinit|non-?finite|not finite", re.IGNORECASE)
_NONFINITE_FACT = re.compile(r"\bNaN\b|\binf\b")
MAX_RERUNS = 3
PREFERENCE = (BORN, FROM_INF, ENTERED)


def flagged_step(outcome: dict[str, Any] | None) -> int | None:
    """The first step whose non-finite flag flipped in a `--nan` run, if any."""
    return ((outcome or {}).get("nonfinite") or {}).get("first_step")


def wants_origin(failure: Failure) -> bool:
    """A failure a NaN or inf explains: its culprit's inputs hold one, or the script's own
    error says so (`assert torch.isfinite(loss)`, "loss is nan")."""
    if failure.nonfinite is not None:
        return False
    if failure.status == "localized":
        return any(_NONFINITE_FACT.search(fact) for row in failure.tensors for fact in row.facts)
    if failure.status == "script-error":
        return bool(MENTIONS_NONFINITE.search(failure.error.message))
    return False


def trace_origin(
    options: LocalizeOptions,
    first: RunResult,
    step: int,
    base: Failure | None,
    progress: Progress,
) -> Failure:
    """The origin of the NaN/inf seen at `step`: with --nan (or no `base`) as the Failure,
    else attached to `base`."""
    outcome = first.outcome or {}
    if not options.rerun:
        hint = "`reprocut record --nan` (without --no-rerun) finds the op that made it"
        if base is None:
            seen = {**outcome, "error": _flag_error(outcome)}
            return not_localized(options, first, seen, f"reruns are off; {hint}")
        return finish(options, base.with_notes(f"NaN/inf explains this failure: {hint}"))
    found, run = _rerun_to_origin(options, step, progress, first.seconds)
    candidate = _pick(found)
    if candidate is None:
        why = (
            "the rerun did not see it again"
            if run.outcome
            else f"the rerun died ({run.returncode or run.signal})"
        )
        if base is not None:
            return finish(options, base.with_notes(f"the NaN/inf could not be traced: {why}"))
        return not_localized(options, first, {**outcome, "error": _flag_error(outcome)}, why)
    inputs = _load(options)
    origin, tensors = _origin(candidate, inputs, _ended(outcome, base))
    if base is not None and not options.nan:
        progress(f"the NaN/inf was made by {origin.op} at step {origin.step} ({origin.phase})")
        return finish(options, replace(base, nonfinite=origin))
    return finish(options, _origin_failure(options, origin, candidate, tensors, base))


def _rerun_to_origin(
    options: LocalizeOptions, step: int, progress: Progress, first_seconds: float
) -> tuple[dict[str, Any] | None, RunResult]:
    found: dict[str, Any] | None = None
    for _ in range(MAX_RERUNS):
        progress(f"rerunning to step {step}, checking every op's outputs for NaN and inf there")
        run, _ = _run_again(
            options, "nonfinite", first_seconds, localize_from=step, localize_to=step, nan=True
        )
        found = (run.outcome or {}).get("nonfinite")
        earlier = flagged_step(run.outcome)
        if found is None or earlier is None or earlier >= step:
            return found, run
        progress(f"step {earlier} already made a NaN/inf")
        step = earlier
    return found, run


def _pick(found: dict[str, Any] | None) -> dict[str, Any] | None:
    candidates = (found or {}).get("candidates") or {}
    for how in PREFERENCE:
        if how in candidates:
            return candidates[how]
    return None


def _load(options: LocalizeOptions) -> dict[str, torch.Tensor]:
    path = options.run_dir.path / NONFINITE_INPUTS_FILE
    return torch.load(path, weights_only=True) if path.exists() else {}


def _ended(outcome: dict[str, Any], base: Failure | None) -> Ended:
    """How the first run ended: the failure it raised, or that it raised none."""
    status = outcome.get("status")
    if status == "failed":
        error = outcome.get("error") or {}
        text = str(error.get("message", "")).strip()
        message = f"{error.get('type', 'Error')}: {text.splitlines()[0] if text else ''}"
        culprit = outcome.get("culprit") or {}
        op = base.op or base.public_call if base is not None else culprit.get("op")
        source = base.source if base is not None and base.source else None
        return Ended(
            "failed",
            message,
            step=outcome.get("step"),
            op=op,
            source=source or location(outcome.get("surfaced_at")),
        )
    if status == "stopped":
        stopped = (outcome.get("nonfinite") or {}).get("stopped_at")
        return Ended(
            "stopped",
            f"no error in the {GRACE_STEPS} steps after it: reprocut stopped the run at step "
            f"{stopped}",
            step=stopped,
        )
    return Ended("passed", "the script ran to its end without an error", step=outcome.get("step"))


def _origin(
    candidate: dict[str, Any], inputs: dict[str, torch.Tensor], ended: Ended
) -> tuple[NonfiniteOrigin, tuple[TensorReport, ...]]:
    source = location(candidate.get("source"))
    call = candidate["call"]
    names = call.get("names") or ()
    raw_args = [arg_from_json(a) for a in call["args"]]
    raw_kwargs = {k: arg_from_json(v) for k, v in call["kwargs"] if plain(v)}
    how = candidate["how"]
    try:
        values = [materialize_arg(on_cpu(a), inputs) for a in raw_args]
        kw_values = {k: materialize_arg(on_cpu(v), inputs) for k, v in raw_kwargs.items()}
        per_arg, facts = nonfinite_facts(
            candidate["op"], how, values, kw_values, names, source.text if source else ""
        )
    except Exception as exc:  # explaining is best effort: never lose the origin over it
        per_arg, facts = {}, (f"(could not analyse the inputs: {exc})",)
    if how == ENTERED and candidate.get("entered_as"):
        held = candidate["entered_as"]
        if "." not in held:  # not a parameter or buffer: an argument of the op
            held = f"the {held} argument of {candidate['op']}"
        facts = (f"{held} already held it when step {candidate['step']} began: no op of that "
                 "step made it (the data, or state from before)", *facts)  # fmt: skip
    origin = NonfiniteOrigin(
        how=how,
        op=candidate["op"],
        kind=candidate["kind"],
        step=candidate["step"],
        phase=candidate["phase"],
        module=candidate.get("module"),
        source=source,
        autograd_node=candidate.get("autograd_node"),
        public_call=candidate.get("public_call"),
        facts=tuple(facts),
        chain=tuple(_link(link) for link in candidate.get("chain", ())),
        ended=ended,
        entered_as=candidate.get("entered_as"),
    )
    return origin, _table(raw_args, raw_kwargs, per_arg, names)


def _link(data: dict[str, Any]) -> Link:
    """A chain link from the child: Link's own JSON, its source line read as `location` reads it."""
    return replace(Link.from_json(data), source=location(data.get("source")))


def _origin_failure(
    options: LocalizeOptions,
    origin: NonfiniteOrigin,
    candidate: dict[str, Any],
    tensors: tuple[TensorReport, ...],
    base: Failure | None,  # the failure the script ended in, if any (in origin.ended)
) -> Failure:
    """`--nan`: the producing op is the failure, and its case is what `shrink` reduces."""
    signature = nonfinite_signature(origin.op, origin.kind)
    cases: list[ReproCase] = []
    if origin.how != ENTERED:
        source = candidate.get("source")
        if candidate.get("public_call") and candidate.get("public"):
            cases.append(
                repro_case(
                    candidate["public_call"], candidate["public"], signature, origin.op, source
                )
            )
        cases.append(
            repro_case(candidate["target"], candidate["call"], signature, origin.op, source)
        )
        cases = [replace(case, check_finite=True) for case in cases]
        # the case's Captured keys are the rerun's: they become the recording's inputs
        shutil.copyfile(options.run_dir.path / NONFINITE_INPUTS_FILE, options.run_dir.inputs_path)
    device = next(
        (spec.device for case in cases for _, spec in case.tensors() if spec.device != "cpu"),
        "cpu",
    )
    return Failure(
        status="nonfinite-input" if origin.how == ENTERED else "localized",
        error=ErrorInfo(NONFINITE_ERROR, NONFINITE_MESSAGE.format(kind=origin.kind)),
        signature=signature,
        op=origin.op,
        public_call=origin.public_call,
        step=origin.step,
        phase=origin.phase,
        module=origin.module,
        source=origin.source,
        forward_source=origin.source if origin.phase == "backward" else None,
        tensors=tensors,
        diagnosis=DIAGNOSES[family(origin.op, origin.how)],
        localization="rerun",
        device=device,
        cases=tuple(cases),
        nonfinite=origin,
    )


def _flag_error(outcome: dict[str, Any]) -> dict[str, Any]:
    what = (outcome.get("nonfinite") or {}).get("flagged_by") or "a value"
    return {"type": NONFINITE_ERROR, "message": f"{what} held NaN or inf"}
