"""The verification started before the reduction ends (reprocut.pipeline.verify_ahead): real
interpreters, real plain runs, a real shrink."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reprocut.check.plainrun import Standbys
from reprocut.check.verify import run_plain
from reprocut.cli import main
from reprocut.model.case import Signature
from reprocut.model.errors import ExitCode
from reprocut.pipeline.verify_ahead import VerifyAhead, code_of
from tests.test_pipeline import _embedding_recording
from tests.test_sanitizer import SPARSE_FAULT

FAILS = "import torch\n\ntorch.zeros(2)[{index}]\n"
SLOW = "import torch\nimport time\n\ntime.sleep(60)\ntorch.zeros(2)[9]\n"


def _expected(tmp_path: Path):
    script = tmp_path / "expected.py"
    script.write_text(FAILS.format(index=5))
    signature = run_plain(script, timeout=120).signature
    assert signature is not None
    return signature


def _wait_for(predicate, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextlib.contextmanager
def _verifying_ahead(
    tmp_path: Path,
    expected: Signature,
    *,
    memcheck: bool = False,
    after_a_round: bool = False,
    settle: float = 0.1,
    first_round_settle: float = 60.0,
) -> Iterator[VerifyAhead]:
    """A VerifyAhead over two interpreters started now, both ended (and its folder removed)
    when the block ends."""
    standbys = Standbys(2, cwd=tmp_path)
    ahead = VerifyAhead(tmp_path, expected, runs=2, timeout=120, memcheck_timeout=300,
                        standbys=standbys, memcheck=memcheck, settle=settle,
                        after_a_round=after_a_round,
                        first_round_settle=first_round_settle)  # fmt: skip
    try:
        yield ahead
    finally:
        ahead.close()
        standbys.close()


def test_code_of_leaves_the_module_docstring_out() -> None:
    code = "import torch\n\ntorch.zeros(2)[5]\n"
    assert code_of(f'"""Header.\n\nMore.\n"""\n\n{code}') == code
    assert code_of(code) == code
    assert code_of(f'"""Another header."""\n{code}') == code
    assert code_of("import torch\n'not a docstring'\n") == "import torch\n'not a docstring'\n"


def test_a_best_that_stood_is_verified_ahead_and_answers_for_the_same_code(tmp_path: Path):
    """The plain runs of the best that stood run in the interpreters started ahead and stand
    for repro.py's when its code is the same, whatever its header says."""
    expected = _expected(tmp_path)
    with _verifying_ahead(tmp_path, expected) as ahead:
        ahead.offer(5, lambda index: FAILS.format(index=index))
        _wait_for(lambda: ahead._current is not None)
        speculation = ahead.take('"""repro.py\'s header."""\n\n' + FAILS.format(index=5))
        assert speculation is not None
        assert speculation.script.parent.parent == tmp_path / "ahead"
        verification = speculation.verification.result(timeout=120)  # type: ignore[union-attr]
        assert (verification.runs, verification.reproduced) == (2, 2)
        assert all(outcome.returncode == 1 for outcome in verification.outcomes)
        assert speculation.memcheck is None
    assert not (tmp_path / "ahead").exists()


def test_in_the_first_round_a_best_goes_ahead_only_once_it_stood_longer(tmp_path: Path):
    """A best offered in the reduction's first round goes ahead once the round has ended, or
    once it has stood the first round's longer while."""
    expected = _expected(tmp_path)
    with _verifying_ahead(tmp_path, expected, after_a_round=True, settle=0.05) as ahead:
        ahead.offer(5, lambda index: FAILS.format(index=index))
        time.sleep(1.0)
        assert ahead._current is None and not (tmp_path / "ahead").exists()
        ahead.round_ended()
        _wait_for(lambda: ahead._current is not None)
        assert ahead._current.script.read_text() == FAILS.format(index=5)  # type: ignore[union-attr]
    with _verifying_ahead(tmp_path, expected, after_a_round=True, settle=0.05,
                          first_round_settle=1.5) as ahead:  # fmt: skip
        started = time.monotonic()
        ahead.offer(6, lambda index: FAILS.format(index=index))
        _wait_for(lambda: ahead._current is not None)
        assert time.monotonic() - started >= 1.5  # no round ended: the longer while
        assert ahead._current.script.read_text() == FAILS.format(index=6)  # type: ignore[union-attr]


def test_a_newer_best_stops_the_older_and_other_code_is_not_answered_ahead(tmp_path: Path):
    """A best offered after another has started stops its runs (their interpreters end) and
    is verified in interpreters started again; repro.py of other code gets nothing."""
    expected = _expected(tmp_path)
    texts = {"slow": SLOW, "fails": FAILS.format(index=7)}
    with _verifying_ahead(tmp_path, expected) as ahead:
        ahead.offer("slow", texts.__getitem__)
        _wait_for(lambda: ahead._current is not None)
        first = ahead._current
        assert first is not None and first.script.read_text() == SLOW
        ahead.offer("fails", texts.__getitem__)
        _wait_for(lambda: ahead._current is not first)
        # the slow script's runs were stopped: their interpreters ended, long before 60 s
        _wait_for(lambda: all(i.process.poll() is not None for i in first.interpreters), 30)
        second = ahead._current
        assert second is not None and second.verification is not None
        assert {i.process.pid for i in second.interpreters}.isdisjoint(
            i.process.pid for i in first.interpreters
        )
        assert second.verification.result(timeout=120).reproduced == 2
        assert ahead.take(FAILS.format(index=9)) is None  # other code: verified afresh


def test_a_shrink_uses_the_verification_that_went_ahead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a machine with the cores for the interpreters started ahead, every best verified
    at once: the last one is repro.py's code, its runs are the verification's (3/3), and the
    folder of the runs that went ahead is gone afterwards."""
    from reprocut.check import plainrun
    from reprocut.pipeline import verify_ahead

    monkeypatch.setattr(plainrun, "WARM_CORES", 1)
    monkeypatch.setattr(verify_ahead, "SETTLE", 0.0)
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv("REPROCUT_CHECK_LOG", str(log))
    run = _embedding_recording(tmp_path)
    code = main(["shrink", str(run.path), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK and result["verified"] == {"runs": 3, "reproduced": 3}, result
    events = [json.loads(line) for line in log.read_text().splitlines()]
    went = [e for e in events if e["kind"] == "verify_ahead"]
    assert any(e["event"] == "plain" for e in went), went  # no memcheck on CPU: at once
    assert went[-1]["event"] == "used", went
    assert not (run.path / "ahead").exists()


SLOW_CUDA = "import torch\nimport time\n\nx = torch.zeros(2, device='cuda')\ntime.sleep(120)\n"


@pytest.mark.cuda
def test_memcheck_goes_ahead_a_newer_best_stops_it_and_the_plain_runs_follow(tmp_path: Path):
    """On a GPU with compute-sanitizer: a best's memcheck starts once it stood; a newer best
    stops it ("cancelled", long before its 120 s sleep ends); the newer one's memcheck finds
    the fault, its plain runs follow, and both answer for repro.py of the same code, the
    memcheck's log copied beside it."""
    from reprocut.check import sanitizer

    if sanitizer.find_sanitizer() is None:
        pytest.skip("compute-sanitizer is not installed")
    fault = tmp_path / "fault.py"
    fault.write_text(SPARSE_FAULT)
    expected = run_plain(fault, timeout=120).signature
    assert expected is not None
    texts = {"slow": SLOW_CUDA, "fault": SPARSE_FAULT}
    with _verifying_ahead(tmp_path, expected, memcheck=True) as ahead:
        ahead.offer("slow", texts.__getitem__)
        _wait_for(lambda: ahead._current is not None)
        first = ahead._current
        assert first is not None and first.memcheck is not None
        ahead.offer("fault", texts.__getitem__)
        assert first.memcheck.result(timeout=60).status == "cancelled"
        assert first.verification is None  # its plain runs had not started: not started now
        _wait_for(lambda: ahead._current is not first and ahead._current is not None)
        _wait_for(lambda: ahead._current.verification is not None, 60)  # type: ignore[union-attr]
        repro = tmp_path / "repro.py"
        repro.write_text('"""The header."""\n\n' + SPARSE_FAULT)
        speculation = ahead.take(repro.read_text())
        assert speculation is not None and speculation.verification is not None
        assert speculation.verification.result(timeout=180).reproduced == 2
        memcheck = speculation.memcheck_for(repro)
        assert memcheck is not None
        evidence = memcheck.result(timeout=300)
        assert evidence.status == "found", evidence.to_json()
        assert evidence.log == str(tmp_path / "sanitizer.log") and Path(evidence.log).is_file()
