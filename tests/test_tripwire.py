"""The tripwire (Python kernels for the asserting ops alone) and the light steps it allows.

Runs record every op only in sampled steps; in the steps between, the tripwire is all that
watches the ops (on CPU, with the raise watch around each torch call: test_raise_watch.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reprocut.record.inside.recorder import Recorder, RecorderConfig
from reprocut.record.inside.tripwire import Tripwire

SCRIPTS = Path(__file__).parent / "scripts"


def test_only_the_named_ops_reach_the_handler_and_the_stock_kernels_come_back():
    seen = []

    def handler(op, args, kwargs, run):
        seen.append(str(op))
        return run()

    weight = torch.randn(10, 4, requires_grad=True)
    ids = torch.tensor([[1, 2], [3, 9]])
    with Tripwire({"aten::embedding", "aten::gather"}, handler) as tripwire:
        assert "embedding" in tripwire.installed
        out = F.embedding(ids, weight)
        (out * 2).sum().backward()
        torch.gather(out, 1, torch.zeros(2, 1, 4, dtype=torch.long))
    assert seen == ["aten.embedding.default", "aten.gather.default"]
    assert torch.equal(out, weight[ids])
    assert torch.equal(weight.grad.sum(1), torch.bincount(ids.flatten(), minlength=10) * 8.0)
    F.embedding(ids, weight)
    assert len(seen) == 2, "closed: the handler is no longer called"


def test_in_place_ops_still_bump_the_version_autograd_checks():
    def handler(op, args, kwargs, run):
        return run()

    with Tripwire({"aten::scatter_add_", "aten::index_put_"}, handler):
        a = torch.ones(3, requires_grad=True)
        b = a.sigmoid()  # saves its output for backward
        version = b._version
        b.scatter_add_(0, torch.tensor([0]), torch.ones(1))
        assert b._version == version + 1
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            b.sum().backward()
        x = torch.zeros(4, requires_grad=True)
        y = x * 2
        y[torch.tensor([1])] = 3.0
        y.sum().backward()
        assert x.grad.tolist() == [2.0, 0.0, 2.0, 2.0]


def test_an_asserting_op_raising_inside_the_tripwire_raises_unchanged():
    def handler(op, args, kwargs, run):
        return run()

    with (
        Tripwire({"aten::index_select"}, handler),
        pytest.raises(IndexError, match="out of range"),
    ):
        torch.index_select(torch.ones(3), 0, torch.tensor([5]))


def train_steps(steps: int, widths: dict[int, int] | None = None) -> None:
    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
    for step in range(steps):
        ids = torch.randint(0, 10, (2, (widths or {}).get(step, 5)))
        logits = head(embed(ids)).flatten(0, 1)
        loss = F.cross_entropy(logits, torch.randint(0, 3, (ids.numel(),)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def as_on_a_gpu(recorder: Recorder) -> None:
    """Light steps as a GPU run's: no raise watch (a CPU run's light steps record no op)."""
    recorder._raise_watch.set = lambda active: None  # type: ignore[method-assign]


def test_light_steps_keep_every_asserting_op_and_sample_every_op(tmp_path):
    with Recorder(RecorderConfig(run_dir=tmp_path, light_steps=True)) as recorder:
        as_on_a_gpu(recorder)
        train_steps(12, widths={6: 7})
        assert recorder.state.step == 12
    steps = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    every_op = [s["step"] for s in steps if s.get("every_op", True)]
    # steps 0-2 and powers of two; step 7 because step 6's asserting ops changed layout
    assert every_op == [0, 1, 2, 4, 7, 8]
    by_step = {s["step"]: s for s in steps}
    light = by_step[6]
    assert light.get("every_op") is False
    names = [op[0] for op in light["ops"]]
    assert names == [
        "aten::embedding",
        "aten::nll_loss_forward",
        "aten::nll_loss_backward",
        "aten::embedding_dense_backward",
    ]
    module, phase, specs = light["ops"][0][1:]
    assert (module, phase) == ("embed", "forward")
    assert specs[1] == [[2, 7], "int64", [7, 1], 0, "cpu"]
    assert by_step[9].get("same_as") == 3, "identical light steps are back-references"
    full = by_step[by_step[4].get("same_as", 4)]
    assert full.get("every_op", True) and len(full["ops"]) > 20, "a sampled step has every op"


def test_cpu_runs_take_light_steps_unless_told_to_record_every_op(tmp_path):
    (tmp_path / "light").mkdir()
    (tmp_path / "full").mkdir()
    with Recorder(RecorderConfig(run_dir=tmp_path / "light")) as recorder:
        train_steps(6)
        assert recorder.light_step and recorder.state.raise_watched
    with Recorder(RecorderConfig(run_dir=tmp_path / "full", light_steps=False)) as recorder:
        train_steps(6)
        assert not recorder.light_step and not recorder.state.raise_watched
    for name, every_op in (("light", [0, 1, 2, 4]), ("full", list(range(6)))):
        lines = (tmp_path / name / "trace.jsonl").read_text().splitlines()
        steps = [json.loads(line) for line in lines]
        assert [s["step"] for s in steps if s.get("every_op", True)] == every_op
    light = [json.loads(line) for line in (tmp_path / "light" / "trace.jsonl").open()][3]
    assert light == {"type": "step", "step": 3, "ops": [], "every_op": False}, (
        "a CPU light step records no op: its errors are met where they are raised"
    )


def test_the_dispatch_mode_is_off_in_light_steps_and_everything_is_removed_on_exit(tmp_path):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with Recorder(RecorderConfig(run_dir=tmp_path, light_steps=True)) as recorder:
        train_steps(5)  # step 5 is light
        assert recorder.light_step
        assert _get_current_dispatch_mode() is None
    assert _get_current_dispatch_mode() is None
    seen = []
    with Tripwire({"aten::embedding"}, lambda op, args, kwargs, run: seen.append(op) or run()):
        pass
    F.embedding(torch.tensor([1]), torch.ones(3, 2))
    assert seen == []


def test_a_torch_that_cannot_take_the_kernels_gets_every_op_recorded(tmp_path, monkeypatch):
    """As on a torch without `increment_version`: nothing stays registered, no step is light."""
    monkeypatch.delattr(torch.autograd.graph, "increment_version")
    seen = []
    with pytest.raises(AttributeError):
        Tripwire({"aten::embedding", "aten::index_add_"}, lambda *a: seen.append(a)).__enter__()
    F.embedding(torch.tensor([1]), torch.ones(3, 2))
    assert seen == [], "the kernel registered before the failure was taken back"
    with Recorder(RecorderConfig(run_dir=tmp_path, light_steps=True)) as recorder:
        assert recorder.tripwire is None
        train_steps(6)
        assert not recorder.light_step
    steps = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert all(s.get("every_op", True) for s in steps)


def localize_light(tmp_path: Path, script: Path):
    """`reprocut record`'s run and localization, with light steps (the default)."""
    from reprocut.localize.failure import LocalizeOptions
    from reprocut.localize.localizer import localize
    from reprocut.model.recording import RunDir
    from reprocut.record.parent.runner import RunRequest, run_script

    run_dir = RunDir.create(tmp_path / "rec")
    first = run_script(
        RunRequest(script, (), run_dir.path, "record", light_steps=True, cwd=tmp_path)
    )
    options = LocalizeOptions(script=script, argv=(), run_dir=run_dir, cwd=tmp_path)
    progress: list[str] = []
    return first, localize(options, first, progress.append), progress


def test_an_asserting_op_failing_in_a_light_step_is_caught_by_the_tripwire(tmp_path):
    first, failure, progress = localize_light(tmp_path, SCRIPTS / "ce_target.py")
    assert first.outcome["light_step"] and first.outcome["step"] == 5
    assert failure.status == "localized" and failure.localization == "in-process"
    assert failure.op == "aten::nll_loss_forward" and failure.step == 5
    assert any("10" in fact for tensor in failure.tensors for fact in tensor.facts)
    assert not progress, "no rerun was needed"


def test_any_other_op_failing_in_a_cpu_light_step_is_named_in_process(tmp_path):
    """The raise watch ran the raising call again under the dispatch mode: no rerun."""
    script = SCRIPTS / "shape_late.py"
    first, failure, progress = localize_light(tmp_path, script)
    assert first.outcome["light_step"] and first.outcome["step"] == 6
    assert first.outcome["raise_watched"] and not first.outcome["raise_missed"]
    assert failure.status == "localized" and failure.localization == "in-process"
    assert failure.op in ("aten::addmm", "aten::mm", "aten::linear")
    assert failure.step == 6
    assert failure.source is not None and "culprit" in failure.source.text
    assert not progress, "no rerun was needed"


def test_an_op_failing_in_a_cpu_light_steps_backward_is_named_by_a_rerun_of_that_step(tmp_path):
    """Backward cannot run twice: the raise watch leaves it to the rerun watching every op."""
    first, failure, progress = localize_light(tmp_path, SCRIPTS / "backward_late.py")
    assert first.outcome["light_step"] and first.outcome["raise_missed"]
    assert failure.status == "localized" and failure.localization == "rerun"
    assert (failure.op, failure.step, failure.phase) == ("aten::mul", 6, "backward")
    assert failure.source is not None and "culprit" in failure.source.text
    assert failure.forward_source is not None and "apply" in failure.forward_source.text
    assert any("could not be watched again" in line for line in progress)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
