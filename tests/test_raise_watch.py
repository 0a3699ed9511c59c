"""CPU light steps: the call that raises is watched again, and names what a full trace names.

Each scenario runs twice in this process, under a recorder with light steps (the default) and
under one that records every op of every step (`--full-trace`); the culprit (op, public call,
line, step, phase, module, loop counters, captured input values) must be the same. The failures
sit in light steps: after step 2, off the powers of two."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from reprocut.record.inside.recorder import Recorder, RecorderConfig

SCRIPTS = Path(__file__).parent / "scripts"
LATE = 10  # a light step


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def train(steps: int, fail: Callable[[Tagger, int], None] | None = None) -> Tagger:
    """A few training steps of a tiny tagger; `fail(model, step)` runs inside each step."""
    torch.manual_seed(0)
    model = Tagger()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        ids = torch.randint(0, 10, (2, 5))
        if fail is not None:
            fail(model, step)
        loss = F.cross_entropy(model(ids).flatten(0, 1), torch.randint(0, 3, (10,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def bad_width_at_late_step(model: Tagger, step: int) -> None:
    if step == LATE:
        model.head(torch.randn(2, 5))  # a shape error in a non-asserting op (addmm)


def bad_id_at_late_step(model: Tagger, step: int) -> None:
    if step == LATE:
        model(torch.tensor([[1, 10]]))  # the tripwire's op: the embedding


def generate_after_the_loop() -> None:
    model = train(6)
    with torch.no_grad():  # each new id is the last one plus one: id 10 is past the table
        ids = torch.tensor([[6, 7]])
        for _ in range(5):
            model(ids)
            ids = torch.cat([ids, ids[:, -1:] + 1], dim=1)


def one_hot_after_the_loop() -> None:
    train(5)
    F.one_hot(torch.tensor([0, 4]), num_classes=3)  # no aten op raises: one_hot's own check


def index_add_in_place_after_the_loop() -> None:
    train(5)
    counts = torch.zeros(3)
    counts.index_add_(0, torch.tensor([0, 7, 1]), torch.ones(3))


def record(scenario: Callable[[], None], run_dir: Path, *, light: bool) -> tuple[Recorder, str]:
    """The scenario under a recorder; returns the recorder and the error's text."""
    run_dir.mkdir()
    config = RecorderConfig(run_dir=run_dir, light_steps=None if light else False)
    with Recorder(config) as recorder:
        with pytest.raises(Exception) as raised:
            scenario()
        recorder.note_unwatched_raise(raised.value)  # as child.py does with the run's error
        assert recorder.light_step == light
        return recorder, f"{raised.type.__name__}: {raised.value}"


def seen(recorder: Recorder) -> dict[str, Any]:
    """The culprit as outcome.json holds it, with each captured tensor's values in place of its
    store key (the keys are numbered by capture order, which the two ways do not share)."""
    culprit = recorder.state.culprit
    assert culprit is not None

    def values(value: Any) -> Any:
        if isinstance(value, dict):
            if isinstance(value.get("captured"), str):
                return recorder.store.tensors[value["captured"]].tolist()
            return {k: values(v) for k, v in value.items()}
        if isinstance(value, list):
            return [values(v) for v in value]
        return value

    return values(json.loads(json.dumps(culprit.to_json(), default=str)))


SCENARIOS = {
    "non-asserting op at a late step": lambda: train(12, bad_width_at_late_step),
    "asserting op at a late step": lambda: train(12, bad_id_at_late_step),
    "embedding in generate() after the loop": generate_after_the_loop,
    "composite public call after the loop": one_hot_after_the_loop,
    "in-place asserting op after the loop": index_add_in_place_after_the_loop,
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_light_path_names_what_the_full_trace_names(tmp_path, name):
    scenario = SCENARIOS[name]
    light, light_error = record(scenario, tmp_path / "light", light=True)
    full, full_error = record(scenario, tmp_path / "full", light=False)
    assert light_error == full_error
    assert light.state.raise_watched and not light.state.raise_missed
    assert seen(light) == seen(full)
    culprit = light.state.culprit
    assert culprit.source is not None and culprit.source.file == __file__
    if "late step" in name:
        assert culprit.step == LATE and culprit.phase == "forward"
    if "one_hot" in name or "composite" in name:
        assert culprit.op is None and culprit.public_call == "torch.nn.functional.one_hot"
    else:
        assert culprit.op is not None and culprit.call is not None


def test_the_culprits_inputs_are_the_values_the_op_failed_on(tmp_path):
    light, _ = record(lambda: train(12, bad_id_at_late_step), tmp_path / "light", light=True)
    culprit = seen(light)
    assert (culprit["op"], culprit["public_call"]) == (
        "aten::embedding",
        "torch.nn.functional.embedding",
    )
    assert culprit["module"] == "model.embed"
    indices = culprit["call"]["args"][1]["tensor"]["values"]
    assert indices == [[1, 10]]
    assert len(light.store.tensors) == 4, "the op's two inputs and the public call's two"


def test_the_scripts_random_numbers_are_those_of_a_plain_run(tmp_path):
    """Running the raising call again draws no random numbers the script would see."""

    def sample_after_a_caught_failure() -> None:
        train(5)
        with contextlib.suppress(RuntimeError):
            torch.multinomial(torch.tensor([-1.0, 2.0]), 1)
        raise ValueError(torch.rand(3).tolist())

    light, error = record(sample_after_a_caught_failure, tmp_path / "light", light=True)
    with pytest.raises(ValueError) as plain:
        sample_after_a_caught_failure()
    assert error == f"ValueError: {plain.value}"
    assert light.state.culprit.op == "aten::multinomial"  # the first op that raised


def test_an_error_the_script_caught_keeps_the_first_culprit_as_a_full_trace_does(tmp_path):
    def caught_then_failed() -> None:
        model = train(5)
        with contextlib.suppress(IndexError):
            model(torch.tensor([[11]]))
        model.head(torch.randn(1, 7))

    light, _ = record(caught_then_failed, tmp_path / "light", light=True)
    full, _ = record(caught_then_failed, tmp_path / "full", light=False)
    assert seen(light) == seen(full)
    assert light.state.culprit.op == "aten::embedding"


def test_a_failing_backward_is_left_to_a_rerun_of_its_step(tmp_path):
    """Backward cannot run twice (its graph is freed as it goes): the step is marked for the
    rerun that watches every op (localize/rerun.py)."""

    class WrongShape(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad[:, :1] + torch.ones(3, 2)  # a shape error, in no asserting op

    def backward_fails() -> None:
        train(5)
        WrongShape.apply(torch.ones(2, 4, requires_grad=True)).sum().backward()

    light, _ = record(backward_fails, tmp_path / "light", light=True)
    assert light.state.raise_missed and light.state.culprit is None


def test_a_call_that_does_not_fail_again_is_left_to_a_rerun(tmp_path):
    calls = []

    @torch.library.custom_op("reprocut_test::flaky", mutates_args=())
    def flaky(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("only the first time")
        return x.clone()

    def fails_once() -> None:
        train(5)
        flaky(torch.ones(2))

    light, error = record(fails_once, tmp_path / "light", light=True)
    assert error == "RuntimeError: only the first time" and len(calls) == 2
    assert light.state.raise_missed and light.state.culprit is None


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_an_op_no_watched_call_ran_leaves_its_step_to_a_rerun_and_a_raise_does_not(tmp_path):
    """TorchScript runs its ops under no public torch call: an error of the kinds ops raise,
    out of a call the watch never saw, may be an op's. The script's own `raise` is not."""

    @torch.jit.script
    def project(x: torch.Tensor, width: int) -> torch.Tensor:
        return x @ torch.ones(width, 2)

    def scripted_op_fails() -> None:
        train(5)
        project(torch.ones(2, 3), 4)

    def script_raises() -> None:
        train(5)
        raise ValueError("no such optimizer: adamw2")

    scripted, error = record(scripted_op_fails, tmp_path / "scripted", light=True)
    assert "TorchScript" in error
    assert scripted.state.raise_missed and scripted.state.culprit is None
    raised, _ = record(script_raises, tmp_path / "raised", light=True)
    assert not raised.state.raise_missed and raised.state.culprit is None


def test_torchs_own_optimizer_steps_run_unwatched_and_the_users_closure_watched(tmp_path):
    from torch.overrides import _get_current_function_mode

    from reprocut.record.inside.raise_watch import RaiseWatch

    modes: list[tuple[str, bool]] = []

    def note(where: str) -> None:
        modes.append((where, isinstance(_get_current_function_mode(), RaiseWatch)))

    class Noting(torch.optim.SGD):  # the user's own optimizer: watched
        def step(self, closure: Any = None) -> Any:
            note("own optimizer")
            return super().step(closure)

    def steps() -> None:
        torch.manual_seed(0)
        model = Tagger()
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=1)
        own = Noting(model.parameters(), lr=0.1)
        sgd.register_step_pre_hook(lambda *a: note("torch optimizer"))

        def closure() -> torch.Tensor:
            note("closure")
            lbfgs.zero_grad()
            loss = model(torch.tensor([[1, 2]])).sum()
            loss.backward()
            return loss

        for _ in range(6):
            model(torch.tensor([[1, 2]])).sum().backward()
            sgd.step()
        lbfgs.step(closure)
        own.step()
        raise ValueError("end")

    with Recorder(RecorderConfig(run_dir=tmp_path)), pytest.raises(ValueError):
        steps()  # sgd's last step is step 5, LBFGS's step 6, the user's optimizer's step 7
    assert modes[-3:] == [("torch optimizer", False), ("closure", True), ("own optimizer", True)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
