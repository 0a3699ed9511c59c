"""The recorder in-process, as frameworks drive it: module paths that exist, phases inside
`optimizer.step(closure)`, the call site inside a library, and the user's loop counters."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys

import pytest
import torch
import torch.nn.functional as F

from reprocut.record.inside.frames import UserFrames
from reprocut.record.inside.loops import LoopCounters, while_counters
from reprocut.record.inside.recorder import Recorder, RecorderConfig


def read_ops(run_dir):
    steps = [json.loads(line) for line in (run_dir / "trace.jsonl").read_text().splitlines()]
    return [op for step in steps if step["type"] == "step" for op in step.get("ops", ())]


def resolves(root: torch.nn.Module, root_name: str, path: str | None) -> bool:
    """`path` names `root` or one of its submodules (as get_submodule resolves it)."""
    if path is None or not (path == root_name or path.startswith(root_name + ".")):
        return False
    try:
        root.get_submodule(path[len(root_name) + 1 :])
    except AttributeError:
        return False
    return True


class LossInForward(torch.nn.Module):
    """As BERT's heads do: the loss module is made inside forward, never registered."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss_fct = torch.nn.CrossEntropyLoss()
        return loss_fct(self.head(self.encoder(x)), labels)


def test_a_loss_made_inside_forward_is_named_after_its_nearest_real_parent(tmp_path):
    model = LossInForward()
    x = torch.randn(2, 4)
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        model(x, torch.tensor([0, 1]))
        with pytest.raises(IndexError):
            model(x, torch.tensor([0, 3]))
        culprit = recorder.state.culprit
    assert culprit is not None and culprit.op == "aten::nll_loss_forward"
    assert culprit.module == "model"  # not "model.crossentropyloss", which does not exist
    names = {op[1] for op in read_ops(tmp_path)} - {None}
    assert names >= {"model", "model.encoder.0", "model.head"}
    assert all(resolves(model, "model", name) for name in names), names


class Classifier(torch.nn.Module):
    """A LightningModule's shape: `self.net` is called from training_step, not forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 3))

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).sum()


def test_a_submodule_called_outside_forward_is_named_under_its_owner(tmp_path, library):
    with Recorder(RecorderConfig(run_dir=tmp_path)):
        library.fit(Classifier(), torch.randn(2, 4), steps=2)  # the library holds the module
    names = {op[1] for op in read_ops(tmp_path)} - {None}
    assert names == {"Classifier.net.0"}  # the class, as no variable holds the module


def test_forward_and_backward_inside_a_step_closure_are_not_the_optimizer(tmp_path):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(torch.randn(2, 4)), torch.tensor([0, 2]))
        loss.backward()
        return loss

    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        optimizer.step(closure)  # Lightning: optimizer.step(closure=...)
        optimizer.step(closure=closure)
        assert recorder.state.step == 2
    ops = read_ops(tmp_path)
    phase_of = {}
    for name, _module, phase, _specs in ops:
        phase_of.setdefault(name, set()).add(phase)
    assert phase_of["aten::nll_loss_forward"] == {"forward"}
    assert phase_of["aten::nll_loss_backward"] == {"backward"}
    assert "optimizer" in {phase for _, _, phase, _ in ops}  # the update itself still is


def test_a_culprit_in_a_closure_is_in_forward(tmp_path):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        return F.cross_entropy(model(torch.randn(2, 4)), torch.tensor([0, 3]))

    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        with pytest.raises(IndexError):
            optimizer.step(closure=closure)
        culprit = recorder.state.culprit
    assert culprit is not None and culprit.phase == "forward"


LIBRARY = """
import torch.nn.functional as F


def classification_loss(logits, labels):
    return F.cross_entropy(logits, labels)  # the call site


def fit(module, x, steps):
    for _ in range(steps):
        module.training_step(x)
"""


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A real module file in an installed package's folder: a library frame, not the user's."""
    folder = tmp_path / "site-packages" / "fakelib"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(LIBRARY)
    spec = importlib.util.spec_from_file_location("fakelib", folder / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "fakelib", module)
    return module


def test_the_call_site_is_the_library_line_that_called_torch(tmp_path, library):
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        with pytest.raises(IndexError):
            library.classification_loss(torch.randn(2, 3), torch.tensor([0, 3]))
        culprit = recorder.state.culprit
    assert culprit is not None
    assert culprit.source is not None and culprit.source.file == __file__  # the user's line
    site = culprit.call_site
    assert site is not None and site.file == library.__file__
    assert (
        site.line
        == LIBRARY.splitlines().index("    return F.cross_entropy(logits, labels)  # the call site")
        + 1
    )


def test_the_call_site_of_a_direct_call_is_the_users_line(tmp_path):
    with Recorder(RecorderConfig(run_dir=tmp_path)) as recorder:
        with pytest.raises(IndexError):
            F.cross_entropy(torch.randn(2, 3), torch.tensor([0, 3]))
        culprit = recorder.state.culprit
    assert culprit.call_site is not None
    assert (culprit.call_site.file, culprit.call_site.line) == (
        culprit.source.file,
        culprit.source.line,
    )


def counters_in_loops(counters: LoopCounters) -> dict[str, int]:
    seen: dict[str, int] = {}

    def inner(epoch: int) -> None:
        for step, (_batch, _) in enumerate([("a", 1), ("b", 2), ("c", 3)]):
            for name in ["x"]:  # noqa: B007 (a loop over non-integers binds no counter)
                if step == 2:
                    seen.update(counters.read(sys._getframe()))

    for epoch in range(2):
        if epoch == 1:
            inner(epoch)
    return seen


def test_loop_counters_are_the_integer_targets_of_enclosing_for_loops():
    counters = LoopCounters(UserFrames())
    assert counters_in_loops(counters) == {"epoch": 1, "step": 2}


def test_loop_counters_are_read_from_a_traceback_and_the_header_line_is_not_in_the_loop():
    counters = LoopCounters(UserFrames())

    def values():
        yield 1
        raise KeyError("in the iterator")

    try:
        for i in range(3):  # noqa: B007
            for j in values():  # noqa: B007 (raises while fetching, after j=1: not the loop's)
                pass
    except KeyError as exc:
        found = counters.from_traceback(exc.__traceback__)
    assert found == {"i": 0}


def test_while_loop_counters_are_names_the_test_compares_and_the_body_steps():
    counters = LoopCounters(UserFrames())
    seen: dict[str, int] = {}
    step, limit, unrelated = 0, 5, 3
    while step < limit and unrelated > 0:
        if step == 3:
            seen.update(counters.read(sys._getframe()))
        step += 1
    assert seen == {"step": 3}  # `limit` and `unrelated` are compared, never stepped


def test_while_counters_read_the_shapes_of_stepping():
    tree = ast.parse(
        "while n > 0 and i < 9 and k <= j:\n"
        "    n -= 1\n"
        "    i = i + 2\n"
        "    def f():\n"
        "        k += 1\n"
    )
    assert while_counters(tree.body[0]) == ["n", "i"]  # k is stepped in another scope


def test_a_backward_on_autograds_own_thread_is_inside_the_training_loop():
    """On a GPU, autograd's engine runs backward (a custom Function's too) on a thread of its
    own, whose frames hold no line of the loop: the main thread, blocked in `backward()` inside
    the loop, says where the step is (the H200 corpus had read step 5 as after the loop)."""
    import threading

    from reprocut.record.inside.loops import TrainingLoop

    training = TrainingLoop(LoopCounters(UserFrames()))
    seen = []

    def backward_on_its_own_thread() -> None:
        seen.append(training.after_frame(sys._getframe()))

    def run_on_a_thread() -> None:
        worker = threading.Thread(target=backward_on_its_own_thread)
        worker.start()
        worker.join()

    for _ in range(2):
        training.note_step(sys._getframe())
        run_on_a_thread()
    assert seen == [None, None]
    run_on_a_thread()  # the loop has ended
    assert seen[-1] is not None
