"""Explain a culprit's inputs: the tensor table and diagnosis a Failure carries.

Takes the recorded call of the culprit (the aten call, else the public call) and the run's saved
inputs; hands on one TensorReport per tensor argument, with the facts `report.diagnosis` finds in
its values, and the diagnosis. All on the CPU: this process never touches CUDA, and explaining is
best effort, so an error here never loses the recording.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from reprocut.model.case import ArgList, Generated, TensorSpec, arg_from_json
from reprocut.model.recording import TensorReport
from reprocut.model.tensors import materialize_arg
from reprocut.report.diagnosis import DIAGNOSES, explain, layout_bears_on, layout_facts


def plain(value: Any) -> bool:
    return not (isinstance(value, dict) and "unsupported" in value)


def explain_inputs(
    culprit: dict[str, Any], inputs: dict[str, torch.Tensor], message: str = ""
) -> tuple[tuple[TensorReport, ...], str]:
    """Tensor table + diagnosis, from the aten call if known, else the public call (`message`:
    the error's, which says the failure's class: only facts bearing on it are kept)."""
    use_public = not culprit.get("call")
    call = culprit.get("public") if use_public else culprit.get("call")
    if not call:
        return (), DIAGNOSES["layout"] if culprit.get("op") is None else ""
    raw_args = [arg_from_json(a) for a in call["args"]]
    raw_kwargs = {k: arg_from_json(v) for k, v in call["kwargs"] if plain(v)}
    if any(_too_big_to_make(a) for a in (*raw_args, *raw_kwargs.values())):
        facts = layout_only(raw_args, raw_kwargs) if layout_bears_on(message) else {}
        return _table(raw_args, raw_kwargs, facts, call.get("names", ())), ""
    public = None if use_public else culprit.get("public")
    if public and any(_too_big_to_make(arg_from_json(a)) for a in public["args"]):
        public = None  # the public call's arguments would be made only to be looked at
    try:
        values = [materialize_arg(on_cpu(a), inputs) for a in raw_args]
        kw_values = {k: materialize_arg(on_cpu(v), inputs) for k, v in raw_kwargs.items()}
        explanation = explain(
            None if use_public else culprit.get("op"),
            culprit.get("public_call"),
            values,
            kw_values,
            message,
        )
        diagnosis = explanation.diagnosis
        if public and (explanation.family == "shape" or not any(explanation.facts.values())):
            # the call the user wrote: F.linear's input, not addmm's reshaped mat1
            by_public = explain(None, culprit.get("public_call"), *_values(public, inputs), message)
            if explanation.family == "shape":
                diagnosis = by_public.diagnosis
            else:
                explanation, diagnosis = by_public, by_public.diagnosis
    except Exception as exc:  # explaining is best effort: never lose the recording over it
        return _table(
            raw_args, raw_kwargs, {}, call.get("names", ())
        ), f"(could not analyse the inputs: {exc})"
    return _table(raw_args, raw_kwargs, explanation.facts, call.get("names", ())), diagnosis


def _values(
    call: dict[str, Any], inputs: dict[str, torch.Tensor]
) -> tuple[list[Any], dict[str, Any]]:
    """A recorded call's arguments as the objects it was called with (on the CPU)."""
    args = [materialize_arg(on_cpu(arg_from_json(a)), inputs) for a in call["args"]]
    kwargs = {k: materialize_arg(on_cpu(arg_from_json(v)), inputs) for k, v in call["kwargs"]
              if plain(v)}  # fmt: skip
    return args, kwargs


_MADE_LIMIT = 1 << 24  # elements of a tensor with no recorded values, generated to be explained


def _too_big_to_make(arg: Any) -> bool:
    """A tensor recorded without values would be generated here only to be looked at: past
    _MADE_LIMIT elements that says nothing and can take minutes (an OOM's culprit on the H200
    had two 36 GiB arguments)."""
    if isinstance(arg, ArgList):
        return any(_too_big_to_make(item) for item in arg.items)
    return (
        isinstance(arg, TensorSpec)
        and isinstance(arg.values, Generated)
        and arg.storage_numel > _MADE_LIMIT
    )


def layout_only(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[int | str, tuple[str, ...]]:
    """The facts a tensor's spec says without its values (stride 0, a layout a flat kernel
    misreads, int32 offsets, a storage offset), for a call whose tensors are too big to make:
    on the H200 a triton_op's gate `expand()`ed over a (128, 256, 4096) input lost its "stride
    0" fact so, where the same call on the CPU, small enough to make, kept it."""
    facts: dict[int | str, tuple[str, ...]] = {}
    for key, arg in (*enumerate(args), *kwargs.items()):
        if isinstance(arg, TensorSpec) and not arg.is_sparse and not arg.is_contiguous:
            found = layout_facts(arg)
            if found:
                facts[key] = found
    return facts


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
