"""NaN/inf origins: the per-step flag, finite checks per op, the corpus, and shrink's repro.

The corpus part records every case of benchmarks/nan_cases.py once (two at a time) and checks
each against its ground truth; `cuda` tests do the same on a GPU (REPROCUT_NAN_DEVICE picks
the device of the parametrized corpus test there too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.nan_cases import NanCase, compare, load_nan_cases, record
from reprocut.model.case import Literal, ReproCase, TensorSpec
from reprocut.model.nonfinite import Ended, Link, NonfiniteOrigin, offending
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.model.signature import classify, is_nonfinite, nonfinite_signature
from reprocut.record.inside.nonfinite import NonfiniteStop, StepFlags
from reprocut.record.inside.recorder import Recorder, RecorderConfig
from reprocut.report.nonfinite import argument_texts, nonfinite_facts
from reprocut.shrink.emitter import emit

CASES = load_nan_cases()


# --- the pieces, in process ----------------------------------------------------------------


def test_flags_flip_at_the_first_nonfinite_step_and_stop_the_run_later():
    flags = StepFlags(stop_after=2)
    for step in range(3):
        flags.watch("loss", [torch.tensor([1.0, 2.0])])
        flags.end_step(step)
    flags.watch("gradients", [torch.tensor([1.0]), torch.tensor([float("inf")], dtype=torch.half)])
    flags.end_step(3)
    assert (flags.first_step, flags.what) == (3, "gradients")
    flags.end_step(4)
    with pytest.raises(NonfiniteStop):
        flags.end_step(5)
    assert flags.stopped_at == 5


def test_a_small_loss_shares_the_gradients_launch_and_keeps_its_name(monkeypatch):
    launches = []
    foreach_norm = torch._foreach_norm

    def counted(tensors, ord):
        launches.append(len(tensors))
        return foreach_norm(tensors, ord)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    flags = StepFlags()
    flags.watch_loss(torch.tensor(float("nan")))
    assert launches == [], "waits for the gradients' check"
    grads = [torch.tensor([1.0], dtype=torch.half), torch.tensor([float("inf")])]
    flags.watch("gradients", grads)
    assert sorted(launches) == [1, 2], "one launch per dtype, the loss among the float32 ones"
    flags.end_step(0)
    assert (flags.first_step, flags.what) == (0, "loss")  # the loss came first
    flags = StepFlags()
    flags.watch_loss(torch.tensor(2.0))
    flags.watch("gradients", [torch.tensor([1.0]), torch.tensor([float("inf")], dtype=torch.half)])
    flags.end_step(0)
    assert flags.what == "gradients", "names follow their tensors across dtype groups"
    flags = StepFlags()
    flags.watch_loss(torch.tensor(float("inf")))
    flags.end_step(0)  # no optimizer: read at the step's end
    assert (flags.first_step, flags.what) == (0, "loss")
    launches.clear()
    flags.watch_loss(torch.ones(1 << 17))  # large: reduced at once, not kept alive
    assert launches == [1]


def test_flags_see_nan_in_gradients_of_a_real_training_step(tmp_path):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(RecorderConfig(run_dir=tmp_path, nan=True)) as recorder:
        for step in range(3):
            out = model(torch.ones(2, 3))
            # step 1: a distance of 0: a finite loss, but d sqrt(u)/du = inf at u = 0
            loss = (out - out.detach()).pow(2).sum().sqrt() if step == 1 else out.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert recorder.flags is not None
        recorder.flags.flush(recorder.state.step)
        assert (recorder.flags.first_step, recorder.flags.what) == (1, "gradients")


def test_the_localized_step_names_the_op_that_made_inf_and_the_ops_that_carried_it(tmp_path):
    config = RecorderConfig(run_dir=tmp_path, nan=True, localize_from=1, localize_to=1)
    scores = torch.tensor([[1.0, 2.0], [30.0, 1.0]], dtype=torch.float16)
    with Recorder(config) as recorder:
        torch.ones(1).sum()  # step 0: outside the window
        recorder._end_step()
        weights = scores.exp()
        (weights / weights.sum(-1, keepdim=True)).sum()
        found = recorder.op_watch.to_json()["candidates"]
    born = found["born"]
    assert (born["op"], born["kind"], born["step"], born["phase"]) == (
        "aten::exp",
        "inf",
        1,
        "forward",
    )
    assert [link["op"] for link in born["chain"][:2]] == ["aten::sum", "aten::div"]
    assert born["chain"][1]["kind"] == "nan"  # inf / inf
    assert born["source"]["line"] > 0


def test_an_in_place_op_is_judged_by_its_inputs_before_it_ran(tmp_path):
    config = RecorderConfig(run_dir=tmp_path, nan=True, localize_from=0, localize_to=0)
    x = torch.tensor([1.0, 0.0, 2.0])
    with Recorder(config) as recorder:
        y = x.clone()
        y.reciprocal_()
        y.mul_(2.0)
        found = recorder.op_watch.to_json()["candidates"]
    assert found["born"]["op"] == "aten::reciprocal_"
    assert [link["op"] for link in found["born"]["chain"]] == ["aten::mul_"]


def test_facts_name_the_operand_as_the_line_spells_it():
    assert argument_texts("x = (x - mean) / std  # note", "aten::div") == ["x - mean", "std"]
    assert argument_texts("std = torch.sqrt(var + self.eps)", "aten::sqrt") == ["var + self.eps"]
    assert argument_texts("w = scores.exp()", "aten::exp") == ["scores"]
    std = torch.ones(8, 1)
    std[7, 0] = 0.0
    numerator = torch.ones(8, 3)
    numerator[7] = 0.0
    _, facts = nonfinite_facts("aten::div", "born", [numerator, std], {}, ("self", "other"),
                               "x = (x - mean) / std")  # fmt: skip
    assert facts == ("std has an exact 0 at [7, 0]", "0 / 0 at [7, 0]: NaN")
    scores = torch.tensor([[1.0, 26.0]], dtype=torch.float16)
    _, facts = nonfinite_facts("aten::exp", "born", [scores], {}, ("self",), "w = scores.exp()")
    assert facts == ("float16 scores max 26 at [0, 1]: exp overflows above 11.09",)


def test_offending_values_follow_each_op_domain():
    assert offending("aten::log", 0, "float32")(0.0)
    assert not offending("torch.log", 0, "float32")(0.5)
    assert offending("torch.Tensor.__truediv__", 1, "float32")(0.0)
    assert offending("aten::exp", 0, "float16")(11.1) and not offending("aten::exp", 0, "float32")(
        11.1
    )
    assert offending("aten::add", 0, "float32") is None


def test_the_signature_is_what_the_repro_raises_and_what_classify_reads():
    signature = nonfinite_signature("aten::exp", "inf")
    assert is_nonfinite(signature) and not is_nonfinite(classify("RuntimeError", "boom"))
    assert classify("FloatingPointError", "non-finite output: inf").matches(signature)


def test_emitted_repro_raises_when_the_output_is_not_finite(tmp_path):
    x = TensorSpec((1, 2), dtype="float16", values=Literal((1.0, 26.0)))
    case = ReproCase("torch.exp", (x,), expected=nonfinite_signature("aten::exp", "inf"),
                     aten_op="aten::exp", check_finite=True)  # fmt: skip
    code = emit(case).code
    assert (
        "out = torch.exp(x)" in code
        and 'raise FloatingPointError("non-finite output: inf")' in code
    )
    (tmp_path / "repro.py").write_text(code)
    done = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.strip().endswith("FloatingPointError: non-finite output: inf")
    in_place = ReproCase("torch.Tensor.reciprocal_", (TensorSpec((1,), values=Literal((0.0,))),),
                         check_finite=True)  # fmt: skip
    assert "x.reciprocal_()\n    outputs = x if isinstance(x" in emit(in_place).code


def test_a_failure_with_an_origin_round_trips_and_old_recordings_still_load():
    origin = NonfiniteOrigin(
        "born", "aten::exp", "inf", 6, "forward", module="model.attn", facts=("f",),
        chain=(Link("aten::sum", "inf", 6, "forward"),), ended=Ended("passed", "ran to its end"),
    )  # fmt: skip
    failure = Failure("localized", ErrorInfo("FloatingPointError", "non-finite output: inf"),
                      nonfinite_signature("aten::exp", "inf"), nonfinite=origin)  # fmt: skip
    data = json.loads(json.dumps(failure.to_json()))
    assert Failure.from_json(data) == failure
    del data["nonfinite"]
    assert Failure.from_json(data).nonfinite is None


# --- the corpus, end to end ------------------------------------------------------------------


def _device() -> str:
    return os.environ.get("REPROCUT_NAN_DEVICE", "cpu")


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[int, dict[str, Any], str]]:
    """Every applicable case recorded once, two at a time."""
    device = _device()
    cases = [c for c in CASES if device in c.devices]
    root = tmp_path_factory.mktemp("nan")

    def one(case: NanCase) -> tuple[int, dict[str, Any], str]:
        folder = root / case.name
        folder.mkdir()
        return record(case, device, folder)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([c.name for c in cases], pool.map(one, cases), strict=True))


def test_the_corpus_covers_the_required_origins():
    truths = [c.origin for c in CASES]
    ops = {t["op"] for t in truths}
    assert {"aten::log", "aten::div", "aten::sqrt", "aten::exp"} <= ops
    assert any(t["phase"] == "backward" for t in truths)
    assert any(t["phase"] == "optimizer" for t in truths)
    assert any("float16" in " ".join(t.get("facts", ())) for t in truths)
    assert any(t.get("ended") == "passed" for t in truths if t["how"] == "born")  # silent NaN
    assert any(not c.with_nan for c in CASES)  # traced without --nan
    for case in CASES:
        case.marker()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_record_finds_the_origin(case: NanCase, recorded) -> None:
    if case.name not in recorded:
        pytest.skip(f"not a {_device()} case")
    code, result, stderr = recorded[case.name]
    assert code == 0, stderr[-3000:]
    problems = compare(case, result)
    assert not problems, "\n".join(problems) + "\n" + json.dumps(result.get("nonfinite"))[:2000]


SHRUNK = ["nan_fp16_attention_exp", "nan_instance_norm_div"]


@pytest.mark.slow
def test_shrink_writes_a_verified_repro_of_the_producing_op(recorded, tmp_path):
    """fp16 exp (precision: finite in float64) and 0 / 0 (the values: NaN in float64 too)."""
    cases = {c.name: c for c in CASES}
    assert all(name in recorded for name in SHRUNK)

    def shrink(name: str) -> tuple[int, dict[str, Any], str]:
        run_dir = recorded[name][1]["run_dir"]
        done = subprocess.run(
            [sys.executable, "-m", "reprocut", "shrink", run_dir, "--json", "--max-time", "60"],
            capture_output=True, text=True, timeout=400,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(
                    [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
                ),
            },
        )  # fmt: skip
        return done.returncode, json.loads(done.stdout or "{}"), run_dir

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(shrink, SHRUNK))
    for name, (code, result, _) in zip(SHRUNK, results, strict=True):
        assert code == 0 and result["status"] == "verified", result
        repro = Path(result["repro"])
        text = repro.read_text()
        assert f"Float64: {cases[name].origin['float64']}" in text, text[:800]
        assert result["signature"]["kind"] == f"non-finite output: {cases[name].origin['kind']}"
        fresh = tmp_path / name
        fresh.mkdir()
        (fresh / "repro.py").write_text(text)
        if (repro.parent / "repro_inputs.pt").exists():
            (fresh / "repro_inputs.pt").write_bytes((repro.parent / "repro_inputs.pt").read_bytes())
        done = subprocess.run(
            [sys.executable, "repro.py"], cwd=fresh, capture_output=True, text=True
        )
        assert "FloatingPointError: non-finite output" in done.stderr
        assert result["tensor_elements"] <= 64, text


@pytest.mark.cuda
@pytest.mark.parametrize("case", [c for c in CASES if "cuda" in c.devices], ids=lambda c: c.name)
def test_record_finds_the_origin_on_cuda(case: NanCase, tmp_path: Path) -> None:
    code, result, stderr = record(case, "cuda", tmp_path)
    assert code == 0, stderr[-3000:]
    problems = compare(case, result)
    assert not problems, "\n".join(problems) + "\n" + json.dumps(result.get("nonfinite"))[:2000]
    if case.with_nan and case.origin["how"] == "born":
        assert result["device"].startswith("cuda"), result["device"]


@pytest.mark.slow
def test_nan_on_a_healthy_script_says_nothing_non_finite_was_seen(tmp_path: Path) -> None:
    script = tmp_path / "healthy.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    loss = model(torch.ones(4, 2)).pow(2).mean()\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--nan", "--json", "--quiet", str(script)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(
                    [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
                ),
            },
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "script-did-not-fail"
    assert "no NaN or inf reached" in result["message"]
