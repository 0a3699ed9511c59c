"""A localization rerun has a limit even where the user gave none: a rerun can hang where the
first run did not (a lock a killed process left), and record must then end and say so."""

from __future__ import annotations

from reprocut.localize.rerun import ended_why, rerun_limit
from reprocut.record.parent.runner import RunResult


def ran(*, timed_out: bool = False, outcome: dict | None = None) -> RunResult:
    return RunResult(None if timed_out else 0, None, timed_out, 1.0, "", "", outcome)


def test_the_limit_is_three_first_runs_and_a_minute_within_the_users_timeout() -> None:
    assert rerun_limit(None, 10.0) == 90.0
    assert rerun_limit(50.0, 10.0) == 50.0  # --timeout stays the ceiling
    assert rerun_limit(500.0, 10.0) == 90.0
    assert rerun_limit(None, None) is None
    assert rerun_limit(30.0, None) == 30.0


def test_a_rerun_without_an_outcome_says_why() -> None:
    assert ended_why(ran(timed_out=True), 90.0) == "it did not end within 90 s and was stopped"
    assert ended_why(ran(), 90.0) == "it crashed"
    assert ended_why(ran(outcome={"status": "passed"}), 90.0) == "it did not fail"
