"""Scoring rules of the corpus harness, on canned `record --json` / `shrink --json` output."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.corpus_audit import AuditFormatError, audit, load_rules  # noqa: E402
from benchmarks.corpus_cases import (  # noqa: E402
    CorpusCase,
    DeviceTruth,
    culprit_markers,
    load_case,
    load_cases,
    tomllib,
)
from benchmarks.corpus_report import render_markdown, write_results  # noqa: E402
from benchmarks.corpus_score import (  # noqa: E402
    RunOutput,
    base_op,
    regressions,
    score_case,
    totals,
    with_audit,
)
from benchmarks.run_corpus import parse_json  # noqa: E402


@pytest.fixture
def case(tmp_path: Path) -> CorpusCase:
    folder = tmp_path / "emb_case"
    folder.mkdir()
    (folder / "train.py").write_text("import model\nmodel.run()\n")
    (folder / "model.py").write_text("def run():\n    x = emb(ids)  # reprocut: culprit\n")
    return CorpusCase(
        name="emb_case",
        folder=folder,
        domain="lm",
        family="embedding",
        devices=("cpu", "cuda"),
        args=(),
        expect="fail",
        op="aten::embedding",
        public_call="torch.nn.functional.embedding",
        file="model.py",
        step=9,
        phase="forward",
        module="model.embed",
        facts=("512",),
        per_device={
            "cpu": DeviceTruth(error_type="IndexError", kind="index out of range in self"),
            "cuda": DeviceTruth(error_code=710, kind="index out of bounds", verified=False),
        },
    )


def record_json(**overrides: object) -> dict:
    data = {
        "status": "localized",
        "op": "aten::embedding",
        "public_call": "torch.nn.functional.embedding",
        "step": 9,
        "phase": "forward",
        "module": "model.embed",
        "source": {"file": "/somewhere/corpus/emb_case/model.py", "line": 2, "text": "x = ..."},
        "signature": {
            "error_type": "IndexError",
            "error_code": None,
            "op": "aten::embedding",
            "kind": "index out of range in self",
        },
        "facts": ["index max 512 ≥ 512 rows at [5, 18]"],
        "run_dir": "/tmp/x/.reprocut/runs/1",
    }
    data.update(overrides)
    return data


SHRINK_OK = {
    "status": "verified",
    "statements": 3,
    "tensor_elements": 2,
    "checks": 24,
    "verified": {"runs": 3, "reproduced": 3},
}


def test_a_fully_right_run_passes_every_check(case: CorpusCase) -> None:
    score = score_case(case, "cpu", RunOutput(0, record_json(), 12.0), RunOutput(0, SHRINK_OK, 9))
    assert score.passed
    assert score.passing_checks() == [
        "outcome",
        "op",
        "line",
        "step",
        "signature",
        "facts",
        "verified",
    ]  # the audit is not scored without outputs to read
    assert (score.statements, score.tensor_elements, score.checks) == (3, 2, 24)
    assert score.module is True


@pytest.mark.parametrize(
    ("overrides", "wrong"),
    [
        ({"op": "aten::index_select"}, "op"),
        ({"source": {"file": "/x/corpus/emb_case/train.py", "line": 2}}, "line"),
        ({"source": {"file": "/x/corpus/emb_case/model.py", "line": 3}}, "line"),
        ({"source": {"file": "/x/corpus/other_case/model.py", "line": 2}}, "line"),
        ({"step": 10}, "step"),
        ({"facts": ["index max 511"]}, "facts"),
        (
            {"signature": {"error_type": "RuntimeError", "kind": "index out of range in self"}},
            "signature",
        ),
    ],
)
def test_each_wrong_field_fails_its_own_check(
    case: CorpusCase, overrides: dict, wrong: str
) -> None:
    score = score_case(case, "cpu", RunOutput(0, record_json(**overrides), 1.0))
    assert getattr(score, wrong) is False
    assert not score.passed
    others = {"op", "line", "step", "signature", "facts"} - {wrong}
    assert all(getattr(score, name) is True for name in others)


def test_overload_names_compare_equal() -> None:
    assert base_op("aten::embedding.default") == "aten::embedding"
    assert base_op("aten.scatter_.value") == "aten::scatter_"
    assert base_op("torch.nn.functional.one_hot") == "torch.nn.functional.one_hot"


def test_public_call_truth_accepts_either_field(case: CorpusCase) -> None:
    one_hot = replace(case, op="torch.nn.functional.one_hot", public_call=None)
    data = record_json(op=None, public_call="torch.nn.functional.one_hot")
    assert score_case(one_hot, "cpu", RunOutput(0, data, 1)).op is True
    data = record_json(op="torch.nn.functional.one_hot", public_call=None)
    assert score_case(one_hot, "cpu", RunOutput(0, data, 1)).op is True


def test_cuda_uses_its_own_op_and_signature(case: CorpusCase) -> None:
    cuda = replace(
        case,
        per_device={
            "cuda": DeviceTruth(op="aten::scatter_", error_code=710, kind="index out of bounds")
        },
    )
    data = record_json(
        op="aten::scatter_.value",
        signature={
            "error_type": "AcceleratorError",
            "error_code": 710,
            "kind": "index out of bounds",
        },
    )
    score = score_case(cuda, "cuda", RunOutput(0, data, 1))
    assert score.op and score.signature
    wrong_code = record_json(signature={"error_code": 700, "kind": "index out of bounds"})
    assert score_case(cuda, "cuda", RunOutput(0, wrong_code, 1)).signature is False


def test_unconfirmed_device_truth_is_noted(case: CorpusCase) -> None:
    score = score_case(case, "cuda", RunOutput(0, record_json(), 1))
    assert any("not yet confirmed" in note for note in score.notes)


def test_kernel_cases_are_scored_by_kernel_name(case: CorpusCase) -> None:
    triton = replace(case, op=None, public_call=None, kernel="add_cond_kernel")
    found = record_json(op=None, public_call="kernels.add_cond_kernel[grid]")
    assert score_case(triton, "cuda", RunOutput(0, found, 1)).op is True
    missed = record_json(op="aten::add", public_call=None)
    assert score_case(triton, "cuda", RunOutput(0, missed, 1)).op is False


def test_a_missed_failure_is_a_wrong_outcome(case: CorpusCase) -> None:
    score = score_case(case, "cpu", RunOutput(1, {"status": "passed"}, 3.0))
    assert score.outcome is False and not score.passed
    assert "record saw no failure" in score.notes


def test_timeouts_and_crashes_fail_the_case(case: CorpusCase) -> None:
    timed_out = score_case(case, "cpu", RunOutput(None, None, 300.0))
    assert timed_out.outcome is False and "record timed out" in timed_out.notes
    crashed = score_case(case, "cpu", RunOutput(3, None, 2.0))
    assert crashed.outcome is False and not crashed.passed


def test_negative_control_must_not_report_a_failure(case: CorpusCase) -> None:
    control = replace(case, expect="pass", per_device={})
    assert score_case(control, "cpu", RunOutput(1, {"status": "passed"}, 1)).passed
    invented = score_case(control, "cpu", RunOutput(0, record_json(), 1))
    assert invented.outcome is False and not invented.passed


def test_silent_cuda_must_pass_on_cuda(case: CorpusCase) -> None:
    silent = replace(case, expect="silent-cuda", per_device={})
    assert silent.expects_failure("cuda") is False
    assert score_case(silent, "cuda", RunOutput(1, {"status": "passed"}, 1)).passed
    loud_on_cpu = replace(silent, per_device={"cpu": DeviceTruth(error_type="RuntimeError")})
    assert loud_on_cpu.expects_failure("cpu") is True


def test_flaky_accepts_both_outcomes_but_not_a_wrong_line(case: CorpusCase) -> None:
    flaky = replace(case, expect="flaky", step=None)
    assert score_case(flaky, "cpu", RunOutput(1, {"status": "passed"}, 1)).passed
    assert score_case(flaky, "cpu", RunOutput(0, record_json(step=3), 1)).passed
    wrong = record_json(source={"file": "/x/corpus/emb_case/train.py", "line": 1})
    assert not score_case(flaky, "cpu", RunOutput(0, wrong, 1)).passed


def test_unverified_shrink_fails_the_verified_check(case: CorpusCase) -> None:
    partial = {**SHRINK_OK, "status": "flaky", "verified": {"runs": 3, "reproduced": 2}}
    score = score_case(case, "cpu", RunOutput(0, record_json(), 1), RunOutput(8, partial, 5))
    assert score.verified is False and not score.passed
    hung = score_case(case, "cpu", RunOutput(0, record_json(), 1), RunOutput(None, None, 300))
    assert hung.verified is False and "shrink timed out" in hung.notes


def test_regressions_lists_only_lost_checks(case: CorpusCase) -> None:
    now = [score_case(case, "cpu", RunOutput(0, record_json(step=4), 1))]
    baseline = {"emb_case": ["outcome", "op", "step"], "not_run_this_time": ["op"]}
    assert regressions(baseline, now) == ["emb_case: step"]


def test_totals_and_markdown(case: CorpusCase) -> None:
    good = score_case(case, "cpu", RunOutput(0, record_json(), 2.0), RunOutput(0, SHRINK_OK, 4))
    bad = score_case(replace(case, name="other"), "cpu", RunOutput(1, {"status": "passed"}, 1.0))
    summary = totals([good, bad])
    assert summary.passed == 1 and summary.right["outcome"] == (1, 2)
    assert summary.record_seconds == 3.0 and summary.median_statements == 3
    meta = {
        "device": "cpu",
        "date": "2026-01-01",
        "device_name": "x",
        "torch": "2.13",
        "python": "3.11",
        "platform": "linux",
        "command": "run",
    }
    text = render_markdown([good, bad], meta)
    assert "| emb_case **pass** | fail | ✓ |" in text
    assert "| other | fail | ✗ |" in text
    assert "**1/2 cases pass**" in text


def test_results_keep_one_name_per_device_and_a_rerun_overwrites(
    case: CorpusCase, tmp_path: Path
) -> None:
    score = score_case(case, "cpu", RunOutput(0, record_json(), 2.0), RunOutput(0, SHRINK_OK, 4))
    meta = {"device": "cpu", "date": "2026-01-01", "device_name": "x", "torch": "2.13",
            "python": "3.11", "platform": "linux", "command": "run"}  # fmt: skip
    out = tmp_path / "results"
    write_results([score], meta, out)
    markdown, twin = write_results([score], {**meta, "date": "2026-01-02"}, out)
    assert (markdown.name, twin.name) == ("corpus-cpu.md", "corpus-cpu.json")
    assert sorted(p.name for p in out.iterdir()) == ["corpus-cpu.json", "corpus-cpu.md"]
    assert "2026-01-02" in markdown.read_text()
    partial, _ = write_results([score], {**meta, "tag": "partial"}, out)
    assert partial.name == "corpus-cpu-partial.md"


def test_parse_json_finds_the_object_after_other_output() -> None:
    assert parse_json('{"a": 1}') == {"a": 1}
    assert parse_json('progress line\n{\n  "a": {"b": 2}\n}\n') == {"a": {"b": 2}}
    assert parse_json("no json here") is None
    assert parse_json("") is None


def test_culprit_markers_and_case_loading(tmp_path: Path) -> None:
    folder = tmp_path / "c1"
    folder.mkdir()
    (folder / "train.py").write_text("a = 1\nb = 2  # reprocut: culprit\n")
    (folder / "case.toml").write_text(
        'name = "c1"\ndomain = "d"\nfamily = "f"\ndevices = ["cpu"]\nexpect = "fail"\n'
        '[expected]\nop = "aten::gather"\nfile = "train.py"\nstep = 2\n'
        '[expected.cpu]\nerror_type = "RuntimeError"\nkind = "k"\n[capture]\nfacts = ["5"]\n'
    )
    assert culprit_markers(folder) == [("train.py", 2)]
    loaded = load_case(folder)
    assert loaded.culprit() == ("train.py", 2)
    assert loaded.truth("cpu").kind == "k" and loaded.facts == ("5",)
    assert not loaded.applies_to("cuda")


def test_scores_round_trip_through_json_for_merging(case: CorpusCase) -> None:
    from benchmarks.corpus_score import CaseScore

    score = score_case(
        case, "cpu", RunOutput(0, record_json(step=4), 2.0), RunOutput(0, SHRINK_OK, 4)
    )
    again = CaseScore.from_json(score.to_json())
    assert again == score and again.passed == score.passed


def test_flaky_cases_only_keep_their_outcome_in_the_baseline(case: CorpusCase) -> None:
    flaky = replace(case, expect="flaky", step=None)
    score = score_case(flaky, "cpu", RunOutput(0, record_json(), 1))
    assert score.passing_checks() == ["outcome", "op", "line"]
    assert score.baseline_checks() == ["outcome"]


def test_truth_comparison_names_each_difference(case: CorpusCase) -> None:
    from benchmarks.check_truth import compare

    observed = {
        "status": "failed",
        "file": "model.py",
        "line": 2,
        "steps": 9,
        "error_type": "IndexError",
        "error_code": None,
        "kind": "index out of range in self",
        "op": "aten::embedding",
        "public_call": "torch.nn.functional.embedding",
    }
    assert compare(case, "cpu", observed) == []
    assert compare(case, "cpu", {**observed, "steps": 8}) == ["steps 8 != 9"]
    assert compare(case, "cpu", {**observed, "line": 3}) == ["line 3 != 2"]
    assert compare(case, "cpu", {"status": "passed"}) == ["did not fail (passed)"]
    cuda = {**observed, "error_type": "AcceleratorError", "error_code": 710}
    assert compare(case, "cuda", {**cuda, "kind": "index out of bounds"}) == []
    assert compare(case, "cuda", {**cuda, "kind": "index out of bounds", "error_code": 700}) == [
        "error_code 700 != 710"
    ]


# --- the facts audit ----------------------------------------------------------------------------

AUDIT = """
[audit]
must = ['index max 512 ≥ 512 rows']
must_not = ['not contiguous', 'an int32 offset wraps']
[audit.json]
must = ['"op": "aten::embedding"']
[audit.panel]
must = ['step 9 \\(forward\\)']
[audit.cpu]
must_not = ['no aten op raised']
[audit.cuda.report]
must = ['CUDA error 710']
"""


def test_audit_rules_are_read_with_their_output_and_device() -> None:
    rules = load_rules(tomllib.loads(AUDIT)["audit"])
    assert [(r.pattern, r.must, r.output, r.device) for r in rules] == [
        ("index max 512 ≥ 512 rows", True, None, None),
        ("not contiguous", False, None, None),
        ("an int32 offset wraps", False, None, None),
        ('"op": "aten::embedding"', True, "json", None),
        ("step 9 \\(forward\\)", True, "panel", None),
        ("no aten op raised", False, None, "cpu"),
        ("CUDA error 710", True, "report", "cuda"),
    ]
    with pytest.raises(AuditFormatError, match="unknown key 'musts'"):
        load_rules({"musts": ["x"]})
    with pytest.raises(AuditFormatError, match="/\\(/"):
        load_rules({"must": ["("]})


def test_the_audit_counts_each_rule_in_each_output_and_names_false_and_missing_facts() -> None:
    rules = load_rules(tomllib.loads(AUDIT)["audit"])
    panel = (
        "╭─ reprocut ─╮\n│ step     9 (forward) │\n│   indices: index max 512 ≥ 512   │\n"
        "│   rows at [5, 18] │\n│   weight: not contiguous: stride (1, 784) for shape (8, 4) │"
    )
    outputs = {"panel": panel, "json": '{"op": "aten::embedding", "facts": ["index max 512 ≥ '
               '512 rows"]}', "report": "", "repro": None}  # fmt: skip
    result = audit(rules, "cpu", outputs)  # type: ignore[arg-type]
    # panel: must, 2 must_not, step, cpu must_not = 5; json: must, 2 must_not, op, cpu = 5
    assert result.checked == 10
    assert result.false == ("panel: false /not contiguous/",)  # read across the wrapped line
    assert result.missing == ()
    cuda = audit(rules, "cuda", {"report": "RuntimeError: CUDA error: device-side assert"})
    assert cuda.missing == (
        "report: missing /index max 512 ≥ 512 rows/",
        "report: missing /CUDA error 710/",
    )
    assert cuda.checked == 4 and not cuda.right


def test_a_false_fact_fails_the_audit_check_and_the_case(case: CorpusCase) -> None:
    audited = replace(case, audit=load_rules({"must_not": ["not contiguous"]}))
    score = score_case(audited, "cpu", RunOutput(0, record_json(), 1.0))
    clean = with_audit(score, audit(audited.audit, "cpu", {"json": "{}"}))
    assert (clean.audit, clean.facts_checked, clean.passed) == (True, 1, True)
    false = with_audit(score, audit(audited.audit, "cpu", {"json": '"not contiguous"'}))
    assert (false.audit, false.false_facts, false.passed) == (
        False, ("json: false /not contiguous/",), False,
    )  # fmt: skip
    assert "audit" in clean.passing_checks() and "audit" not in false.passing_checks()
    assert type(false).from_json(false.to_json()) == false
    meta = {"device": "cpu", "date": "2026-01-01", "device_name": "x", "torch": "2.13",
            "python": "3.11", "platform": "linux", "command": "run"}  # fmt: skip
    text = render_markdown([clean, replace(false, case="other")], meta)
    assert "| ✓ 1 |" in text and "| ✗ 1/1 |" in text
    assert "Facts audit (case.toml `[audit]`): 2 facts checked, false facts found: 1" in text
    assert "- other: json: false /not contiguous/" in text


def test_a_step_after_the_training_loop_is_scored_by_the_steps_that_ran(case: CorpusCase) -> None:
    after = {"steps": 9, "function": "evaluate", "text": "..."}
    score = score_case(case, "cpu", RunOutput(0, record_json(step=None, after_loop=after), 1.0))
    assert score.step is True
    wrong = {"steps": 8, "function": "evaluate", "text": "..."}
    assert (
        score_case(case, "cpu", RunOutput(0, record_json(step=None, after_loop=wrong), 1)).step
        is False
    )


def test_every_corpus_case_has_audit_rules_for_each_of_its_devices() -> None:
    for corpus_case in load_cases():
        assert corpus_case.audit, f"{corpus_case.name}: no [audit]"
        for device in corpus_case.devices:
            rules = [r for r in corpus_case.audit if r.device in (None, device)]
            assert any(not r.must for r in rules), f"{corpus_case.name}: no must_not on {device}"
            if corpus_case.expects_failure(device) or corpus_case.expect == "pass":
                assert any(r.must for r in rules), f"{corpus_case.name}: no must on {device}"


def test_a_benchmark_runs_reprocut_from_the_tree_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench_faults --tree`: two commits in one device call. The commands import `reprocut`
    from that checkout, ahead of this one and of a PYTHONPATH already set."""
    from benchmarks import run_corpus

    tree = tmp_path / "old"
    (tree / "reprocut").mkdir(parents=True)
    (tree / "reprocut" / "__init__.py").write_text("")
    which = [
        sys.executable,
        "-c",
        "import json, reprocut; print(json.dumps({'at': reprocut.__file__}))",
    ]
    monkeypatch.setattr(run_corpus, "_code_root", run_corpus._code_root)  # undone after the test
    assert Path(run_corpus.run_json(which, tmp_path, 60).data["at"]).is_relative_to(REPO)
    run_corpus.use_tree(tree)
    assert Path(run_corpus.run_json(which, tmp_path, 60).data["at"]).is_relative_to(tree)
    with pytest.raises(SystemExit, match="no reprocut package"):
        run_corpus.use_tree(tmp_path)
