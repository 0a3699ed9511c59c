"""The first case's check, run from the recording's inputs.pt before this process read it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from reprocut.check.oracle import Oracle, Reproduced
from reprocut.model.case import Captured, Generated, ReproCase, Signature, TensorSpec
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.pipeline.cases import pick_case
from reprocut.pipeline.first_check import FirstCheck

EMBEDDING = Signature("IndexError", None, "aten::embedding", "index out of range in self")
ERROR = ErrorInfo("IndexError", "index out of range in self")


def _case(rows: int = 10) -> ReproCase:
    return ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((300,), dtype="int64", values=Captured("ids")),
            TensorSpec((rows, 3), values=Generated("randn")),
        ),
        expected=EMBEDDING,
        aten_op="aten::embedding",
    )


def _recording(tmp_path: Path) -> Path:
    ids = torch.arange(300) % 10
    ids[-1] = 1000  # the bad id, in a captured tensor too big to inline
    path = tmp_path / "inputs.pt"
    torch.save({"ids": ids, "other": torch.ones(2)}, path)
    return path


def test_the_first_check_loads_the_recordings_inputs_itself(tmp_path: Path) -> None:
    inputs_path = _recording(tmp_path)
    before = hashlib.sha256(inputs_path.read_bytes()).hexdigest()
    case = _case()
    with Oracle(timeout=60) as oracle:
        first = FirstCheck(oracle, case, EMBEDDING, inputs_path)
        verdict = first.verdict_for(case)
        assert isinstance(verdict, Reproduced)
        assert first.verdict_for(_case(rows=2000)) is None  # not the case it checked
        # a later check writes its own sidecar in the oracle's folder, never into the recording
        inputs = torch.load(inputs_path, weights_only=True)
        assert isinstance(oracle.check_case(case, inputs), Reproduced)
    assert hashlib.sha256(inputs_path.read_bytes()).hexdigest() == before


def test_pick_case_takes_the_first_checks_verdict(tmp_path: Path) -> None:
    inputs_path = _recording(tmp_path)
    inputs = torch.load(inputs_path, weights_only=True)
    case = _case()
    failure = Failure("localized", ERROR, EMBEDDING, cases=(case,))
    with Oracle(timeout=60) as oracle:
        first = FirstCheck(oracle, case, EMBEDDING, inputs_path)
        picked, verdicts = pick_case(failure, inputs, oracle, first)
        assert picked == case and len(verdicts) == 1 and oracle.checks == 1
        passing = FirstCheck(oracle, _case(rows=2000), EMBEDDING, inputs_path)
        wide = Failure("localized", ERROR, EMBEDDING, cases=(_case(rows=2000),))
        picked, verdicts = pick_case(wide, inputs, oracle, passing)
        assert picked is None and oracle.checks == 3  # not reproduced: checked again here
