"""Checks run with one CUDA connection (childenv.ONE_CONNECTION), unless that changes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprocut.check.childenv import ONE_CONNECTION, child_environment
from reprocut.check.oracle import Oracle, Passed, Reproduced
from reprocut.model.case import Signature

SHOW = "import os\nraise ValueError(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset'))\n"


def test_a_check_runs_with_one_connection_and_a_users_own_setting_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ONE_CONNECTION[0], raising=False)
    assert child_environment(one_connection=True)[ONE_CONNECTION[0]] == "1"
    assert ONE_CONNECTION[0] not in child_environment()  # probes: the user's environment
    with Oracle(timeout=60) as oracle:
        verdict = oracle.check_source(SHOW, filename=str(tmp_path / "c.py"), cwd=tmp_path)
    assert verdict.message.strip() == "1"
    monkeypatch.setenv(ONE_CONNECTION[0], "8")
    with Oracle(timeout=60) as oracle:
        verdict = oracle.check_source(SHOW, filename=str(tmp_path / "c.py"), cwd=tmp_path)
    assert verdict.message.strip() == "8"


NEEDS_QUEUES = """
import os
import torch
torch.empty(1, device="cuda")
if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
    raise ValueError("bad")
"""


@pytest.mark.cuda
def test_a_first_check_that_reproduces_only_with_many_connections_turns_the_setting_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure that needs two streams' kernels to overlap cannot with one queue: the first
    check that did not reproduce runs again without it; reproducing there, the oracle's later
    checks run without it too."""
    monkeypatch.delenv(ONE_CONNECTION[0], raising=False)
    expected = Signature("ValueError", None, None, "bad")
    with Oracle(expected, timeout=60) as oracle:
        script = str(tmp_path / "c.py")
        assert isinstance(
            oracle.check_source(NEEDS_QUEUES, filename=script, cwd=tmp_path), Reproduced
        )
        assert not oracle.connection.on
        assert isinstance(
            oracle.check_source(NEEDS_QUEUES, filename=script, cwd=tmp_path), Reproduced
        )
    with Oracle(expected, timeout=60) as oracle:  # one that passes either way keeps it
        passing = "import torch\ntorch.empty(1, device='cuda')\n"
        assert isinstance(oracle.check_source(passing, filename=script, cwd=tmp_path), Passed)
        assert oracle.connection.on


def test_only_the_first_verdict_of_a_child_that_started_cuda_is_looked_at_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The choice's steps on CPU (the GPU test above runs them for real): a verdict from a
    child without CUDA, or after the first, is taken as it is; the first one that did not
    reproduce in a CUDA child is run again without the setting, in the environment it gets."""
    from reprocut.check.connections import ConnectionChoice

    monkeypatch.delenv(ONE_CONNECTION[0], raising=False)
    bad = Signature("ValueError", None, None, "bad")
    passed, reproduced = Passed(0.1), Reproduced(bad, "bad", "", 0.1)
    seen: list[dict[str, str]] = []

    def again(env: dict[str, str]) -> Reproduced:
        seen.append(env)
        return reproduced

    cpu = ConnectionChoice(blocking=False)
    assert cpu.first_verdict({"verdict": {"cuda": False}}, passed, again) == (passed, False)
    assert cpu.on and not seen
    gpu = ConnectionChoice(blocking=False)
    assert gpu.environment()[ONE_CONNECTION[0]] == "1"
    assert gpu.first_verdict({"verdict": {"cuda": True}}, passed, again) == (reproduced, True)
    assert not gpu.on and ONE_CONNECTION[0] not in seen[0]
    assert ONE_CONNECTION[0] not in gpu.environment()
    later = ConnectionChoice(blocking=False)
    assert later.first_verdict({"verdict": {"cuda": True}}, reproduced, again) == (
        reproduced,
        False,
    )
    assert later.first_verdict({"verdict": {"cuda": True}}, passed, again) == (passed, False)
    assert later.on and len(seen) == 1  # only the first verdict decides
