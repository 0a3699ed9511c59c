"""benchmarks/rule_audit.py: static rules held against a logged reduction's verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_failed_prefix import reduce_vendored

from benchmarks.rule_audit import audit, main


def test_a_reductions_log_holds_its_candidates_rules_and_bests_and_its_own_rules_skip_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real CPU reduction, logged: every check carries the candidate's text, the reduction
    its rules and each accepted best; held to the rules that ran it, no check is skipped."""
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv("REPROCUT_CHECK_LOG", str(log))
    result = reduce_vendored(tmp_path)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    checks = [e for e in events if e["kind"] == "check"]
    assert checks and all("code" in e for e in checks)
    assert [e["kind"] for e in events].count("rules") == 1
    accepted = [e for e in events if e["kind"] == "accepted" and e.get("reducer") == "source"]
    assert accepted and all(e["code"] for e in accepted)
    found = audit(log)
    assert 0 < found.checks <= result.checks
    assert sum(found.skipped.values()) == 0 and not found.reproduced


def _log(path: Path, *events: dict) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


BEST = "import cupy\nimport torch\nK = cupy.RawKernel('...', 'k')\nx = torch.randn(4, device='cuda')\nK((1,), (1,), (cupy.asarray(x), 4))\n"  # fmt: skip
FOCUS = "K((1,), (1,), (cupy.asarray(x), 4))"


def test_a_check_the_rules_now_reject_is_counted_by_its_verdict_and_a_reproduced_one_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bare tensor handed to a CuPy launch, logged as an OtherFailure (what it does) and, in
    a second log, as reproduced (what it cannot do): the first is a check saved, the second a
    rule the device contradicts, and the command fails on it."""
    bare = BEST.replace("(cupy.asarray(x), 4)", "(x, 4)")
    rules = {"kind": "rules", "reducer": "source", "focus": FOCUS, "memory_fault": True,
             "code": BEST}  # fmt: skip
    saved = _log(tmp_path / "saved.jsonl", rules,
                 {"kind": "check", "verdict": "OtherFailure", "code": bare},
                 {"kind": "check", "verdict": "Passed", "code": BEST.replace(", 4)", ", 3)")})  # fmt: skip
    found = audit(saved)
    assert found.checks == 2 and found.skipped == {"OtherFailure": 1} and not found.reproduced
    assert main([str(saved)]) == 0
    contradicted = _log(tmp_path / "contradicted.jsonl", rules,
                        {"kind": "check", "verdict": "Reproduced", "code": bare})  # fmt: skip
    assert main([str(contradicted), "--out", str(tmp_path / "audit.md")]) == 1
    text = (tmp_path / "audit.md").read_text()
    assert "| contradicted | 1 | 1 | Reproduced 1 | 1 | 1 |" in text
    assert "TypeError: K argument 0 is a torch tensor" in text
    unseeded = BEST.replace("x = torch.randn", "torch.manual_seed(0)\nx = torch.randn")
    policy = _log(tmp_path / "policy.jsonl", {**rules, "code": unseeded},
                  {"kind": "check", "verdict": "Reproduced", "code": BEST})  # fmt: skip
    assert main([str(policy)]) == 0  # a seed dropped may reproduce: the rule keeps it the user's
    assert audit(policy).reproduced and not audit(policy).contradicted
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert "no such log" in capsys.readouterr().err
