"""The per-step non-finite check of `--nan`: one check per step, at the optimizer's exit.

Losses, gradients and parameters are reduced together when the optimizer's step is done; these
tests pin that the merged check still names the right step and the right group wherever the
first non-finite value was born, and in the loops that have no optimizer step to wait for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reprocut.record.inside.nonfinite import StepFlags
from reprocut.record.inside.recorder import Recorder, RecorderConfig

_INF = float("inf")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of tensors of each `_foreach_norm` call (the real one runs)."""
    counts: list[int] = []
    foreach_norm = torch._foreach_norm

    def counted(tensors, ord):
        counts.append(len(tensors))
        return foreach_norm(tensors, ord)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    return counts


def test_the_loss_gradients_and_parameters_share_one_launch_per_dtype_at_the_step_end(launches):
    weight = torch.nn.Parameter(torch.ones(2))
    half = torch.nn.Parameter(torch.ones(2, dtype=torch.half))
    optimizer = torch.optim.SGD([weight, half], lr=0.1)
    weight.grad = torch.ones(2)
    half.grad = torch.tensor([1.0, float("inf")], dtype=torch.half)
    flags = StepFlags()
    flags.watch_loss(torch.tensor(2.0))
    flags.enter_optimizer(optimizer)
    flags.watch_optimizer(optimizer)
    assert launches == [], "nothing is reduced before the step's end"
    flags.end_step(0)
    assert sorted(launches) == [2, 3], "float32: loss, grad, weight; float16: grad, weight"
    assert (flags.first_step, flags.what) == (0, "gradients"), "names follow their tensors"
    half.grad = torch.ones(2, dtype=torch.half)
    with torch.no_grad():
        half.fill_(float("nan"))
    flags = StepFlags()
    flags.watch_optimizer(optimizer)
    flags.end_step(3)
    assert (flags.first_step, flags.what) == (3, "parameters")


def test_a_parameter_swapped_into_the_optimizer_is_the_one_checked():
    """The optimizer's tensors are cached between steps, but only while they are the same."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    flags = StepFlags()
    for step in range(3):
        if step == 2:  # a resized embedding put in the old one's place: as many parameters
            optimizer.param_groups[0]["params"][0] = torch.nn.Parameter(torch.full((3,), -_INF))
        flags.watch_optimizer(optimizer)
        flags.end_step(step)
    assert (flags.first_step, flags.what) == (2, "parameters")


def test_an_optimizer_that_raises_still_has_its_gradients_checked_at_the_flush(tmp_path: Path):
    with Recorder(RecorderConfig(run_dir=tmp_path, nan=True)) as recorder:
        # Adam refuses the embedding's sparse gradient
        model = torch.nn.Sequential(torch.nn.Embedding(4, 2, sparse=True), torch.nn.Linear(2, 1))
        optimizer = torch.optim.Adam(model.parameters())
        out = model(torch.tensor([0, 1]))
        loss = (out - out.detach()).pow(2).sum().sqrt()  # d sqrt(u)/du = inf at u = 0
        loss.backward()
        with pytest.raises(RuntimeError, match="sparse"):
            optimizer.step()
    assert recorder.flags is not None
    recorder.flags.flush(recorder.state.step)
    assert (recorder.flags.first_step, recorder.flags.what) == (0, "gradients")


def _train(tmp_path: Path, optimizer_for, loss_at, steps: int = 4) -> StepFlags:
    torch.manual_seed(0)
    with Recorder(RecorderConfig(run_dir=tmp_path, nan=True)) as recorder:
        model = torch.nn.Linear(3, 1)
        extra = torch.nn.Parameter(torch.ones(2))  # its gradient is exactly 0 in every step
        optimizer = optimizer_for([*model.parameters(), extra])
        for step in range(steps):
            loss = loss_at(step, model(torch.ones(4, 3)), optimizer) + 0.0 * extra.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert recorder.flags is not None
        recorder.flags.flush(recorder.state.step)
    return recorder.flags


def test_a_nan_born_in_the_gradients_only_names_its_step_and_the_gradients(tmp_path: Path):
    def loss_at(step: int, out: torch.Tensor, optimizer: object) -> torch.Tensor:
        if step == 2:  # a finite loss whose gradient is inf: sqrt at 0
            return (out - out.detach()).pow(2).sum().sqrt()
        return out.pow(2).mean()

    flags = _train(tmp_path, lambda params: torch.optim.SGD(params, lr=0.01), loss_at)
    assert (flags.first_step, flags.what) == (2, "gradients")


def test_a_nan_the_optimizer_makes_from_finite_gradients_names_the_parameters(tmp_path: Path):
    def loss_at(step: int, out: torch.Tensor, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        if step == 1:  # Adam with eps 0 on a zero gradient: 0 / (sqrt(0) + 0)
            optimizer.param_groups[0]["eps"] = 0.0
        return out.pow(2).mean()

    flags = _train(tmp_path, lambda params: torch.optim.Adam(params, lr=0.01), loss_at)
    assert (flags.first_step, flags.what) == (1, "parameters")


def test_a_closure_optimizer_is_checked_once_per_step_with_the_closures_losses(
    tmp_path: Path, launches: list[int]
):
    torch.manual_seed(0)
    data = torch.ones(5, 4, 3)
    data[3, 0, 0] = float("inf")
    with Recorder(RecorderConfig(run_dir=tmp_path, nan=True)) as recorder:
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3)
        for step in range(5):

            def closure(step: int = step) -> torch.Tensor:
                optimizer.zero_grad()
                loss = model(data[step]).pow(2).mean()
                loss.backward()
                return loss

            before = len(launches)
            optimizer.step(closure)
            if step == 1:  # step 0 also checked the first output (no loss seen yet)
                assert len(launches) == before + 1, "the closure's losses wait for the step's end"
        assert recorder.flags is not None
        recorder.flags.flush(recorder.state.step)
    assert (recorder.flags.first_step, recorder.flags.what) == (3, "loss")


def test_a_step_a_grad_scaler_skips_is_not_flagged(tmp_path: Path):
    """GradScaler never calls optimizer.step when the scaled gradients are inf: expected with
    loss scaling, not a NaN to report."""
    with Recorder(RecorderConfig(run_dir=tmp_path, nan=True)) as recorder:
        weight = torch.nn.Parameter(torch.tensor([1e-20, 2.0]))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for step in range(3):
            # step 1: sqrt at 0, an inf gradient from a finite loss
            loss = (weight - 1e-20).abs().pow(0.5).sum() if step == 1 else weight[1].pow(2)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        assert recorder.flags is not None
        recorder.flags.flush(recorder.state.step)
    assert scaler.get_scale() < 2.0**10, "the scaler skipped a step"
    assert recorder.flags.first_step is None
    assert recorder.flags.checked_through == 1, "two optimizer steps ran"


def test_an_evaluation_loop_is_checked_by_its_model_outputs(tmp_path: Path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    batches = torch.ones(5, 4, 3)
    batches[2, 1] = float("inf")
    with Recorder(RecorderConfig(run_dir=tmp_path, nan=True)) as recorder, torch.no_grad():
        for batch in batches:
            model(batch)
        assert recorder.flags is not None
        recorder.flags.flush(recorder.state.step)
    assert (recorder.flags.first_step, recorder.flags.what) == (2, "model outputs")
    assert recorder.flags.checked_through == 4


_CUDA_LOOP = """
import json, sys
from pathlib import Path
import torch
import torch.nn.functional as F
from reprocut.record.inside.recorder import Recorder, RecorderConfig

torch.manual_seed(0)
flag_buffers, snapshot_buffers, targets, matches = {}, {}, {}, []


def check_snapshots(recorder):  # every snapshot not yet retired holds its own step's target
    torch.cuda.synchronize()
    for snapshot in recorder.state.all_snapshots():
        if snapshot.op == "aten::nll_loss_forward":
            copy = recorder.store.tensors[snapshot.call.args[1].key]
            matches.append((snapshot.step, bool(torch.equal(copy, targets[snapshot.step]))))


with Recorder(RecorderConfig(run_dir=Path(sys.argv[1]), nan=True)) as recorder:
    recorder.flags.stop_after = None
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for step in range(40):
        x = torch.randn(16, 8, device="cuda")
        if step == 30:
            x[3, 2] = float("inf")
        y = torch.randint(0, 4, (16,), device="cuda")
        targets[step] = y.cpu()
        loss = F.cross_entropy(model(x), y)
        check_snapshots(recorder)  # the step's own copy, just made
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for _, hosts, _, _ in recorder.flags._pending:
            flag_buffers.update((id(h), h) for h in hosts)  # kept alive: ids stay unique
        store = recorder.store
        snapshot_buffers.update((id(t), t) for k, t in store.tensors.items() if k in store.pinned)
        check_snapshots(recorder)  # the steps still pending, after later copies
    recorder.flags.flush(recorder.state.step)
print(json.dumps({
    "flags": recorder.flags.to_json(),
    "flag_buffers": len(flag_buffers),
    "snapshot_buffers": len(snapshot_buffers),
    "matches": matches,
}))
"""


@pytest.mark.cuda
def test_on_cuda_steps_reuse_pinned_buffers_and_events_and_the_copies_hold_their_step(tmp_path):
    """40 steps of a real CUDA loop (in a child: the pytest process keeps CUDA uninitialized):
    the flags' and the snapshots' pinned buffers come back for later steps, every snapshot
    still holds its own step's target, and the inf born at step 30 is flagged there."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", _CUDA_LOOP, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["flags"]["first_step"], result["flags"]["flagged_by"]) == (30, "loss")
    assert result["flags"]["checked_through"] == 39
    assert {step for step, _ in result["matches"]} == set(range(40))
    assert all(ok for _, ok in result["matches"]), result["matches"]
    assert result["flag_buffers"] <= 6, "one pinned buffer per step, not reused"
    assert result["snapshot_buffers"] <= 12, "one pinned copy per step, not reused"
