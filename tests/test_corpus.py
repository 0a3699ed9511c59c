"""The corpus as a regression suite.

- Every case.toml is well formed and its culprit marker exists exactly once (fast).
- The ground truth itself holds on CPU: an independent observer (benchmarks/truth_probe.py)
  sees each CPU case fail at its marked line, step, op and error (slow).
- reprocut record over the CPU corpus: no check that passes in corpus/baseline.json may regress
  (slow; skipped only while the record command is missing). Shrink is tested on corpus cases
  in tests/test_shrink_cli.py.
- The facts audit over that run: the panel and `--json` of every CPU case are read against the
  case's `[audit]` rules (benchmarks/corpus_audit.py); a false fact or a missing one fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.check_truth import compare, probe_case  # noqa: E402
from benchmarks.corpus_cases import CORPUS, CorpusCase, culprit_markers, load_cases  # noqa: E402
from benchmarks.corpus_score import regressions  # noqa: E402
from benchmarks.run_corpus import run_cases  # noqa: E402
from benchmarks.truth_probe import MARKER as PROBE_MARKER  # noqa: E402

BASELINE = CORPUS / "baseline.json"
CASES = load_cases()
CPU_CASES = [c for c in CASES if c.applies_to("cpu")]
# Shrink is the slow half (25-100 s a case on 2 cores). CI shrinks corpus cases in
# tests/test_shrink_cli.py (record -> shrink -> `python repro.py` from an empty folder, on
# lm_grown_vocab, rl_dqn_gather and llm_sampling_nan), so this regression run records only.
SHRINK_IN_CI: set[str] = set()


def test_the_corpus_is_large_and_covers_the_required_kinds() -> None:
    assert len(CASES) >= 20
    assert sum(c.devices == ("cuda",) for c in CASES) >= 4
    assert {"pass", "flaky", "silent-cuda"} <= {c.expect for c in CASES}
    domains = {c.domain.split()[0] for c in CASES}
    assert len(domains) >= 8, domains
    phases = {c.phase for c in CASES}
    assert {"forward", "backward", "optimizer"} <= phases


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case_is_well_formed(case: CorpusCase) -> None:
    assert case.script.exists()
    markers = culprit_markers(case.folder)
    if case.expect == "pass":
        assert markers == []
        return
    assert len(markers) == 1, f"need exactly one culprit marker, found {markers}"
    assert markers[0][0] == case.file, "case.toml `file` disagrees with the marker"
    for device in case.devices:
        if case.expects_failure(device) or case.expect == "flaky":
            truth = case.truth(device)
            assert truth.kind, f"no expected kind for {device}"
            assert truth.error_type or truth.error_code is not None
    if case.launch == "pytest":  # a test has no step: the failing test is named instead
        assert case.test and case.test.startswith("tests/") and case.test_line
    elif case.expect == "fail":
        assert case.step is not None
    if case.launch == "notebook":
        assert case.cell is not None
    if case.expect == "fail":
        assert case.phase in ("forward", "backward", "optimizer")
        assert case.op or case.kernel
        assert case.facts, "say which values/strides must be captured"


def test_memory_fault_cases_say_which_bug_they_are() -> None:
    """Every CUDA memory fault (illegal or misaligned address) has the memcheck fingerprint a
    repro must keep; the custom-op cases name their op outside aten."""
    memory = [c for c in CASES if c.truth("cuda").error_code in (700, 716)]
    assert len(memory) >= 9
    for case in memory:
        assert case.fingerprint, f"{case.name}: no [expected.fingerprint]"
        custom_op = bool(case.op) and not str(case.op).startswith("aten::")  # its own kernel
        assert custom_op or case.fingerprint["kernel"] in (case.kernel, case.expected_op("cuda"))
    custom = {c.op for c in CASES if c.op and not c.op.startswith("aten::")}
    assert {"rowpad::pack_rows", "fused::gated"} <= custom


@pytest.mark.slow
def test_ground_truth_holds_on_cpu() -> None:
    # notebooks and pytest suites: their truth is checked by test_notebook.py and
    # test_pytest_record.py (the probe runs scripts) and by the corpus run below
    checked = [c for c in CPU_CASES if c.expect != "flaky" and c.launch == "script"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        observed = list(pool.map(lambda c: probe_case(c, "cpu", 300), checked))
    problems = [
        f"{case.name}: {'; '.join(diffs)}"
        for case, got in zip(checked, observed, strict=True)
        if (diffs := compare(case, "cpu", got))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.skipif(
    not (REPO / "reprocut" / "commands" / "record.py").exists(),
    reason="reprocut record is not written yet",
)
def test_record_and_shrink_do_not_regress_on_the_cpu_corpus(tmp_path: Path) -> None:
    baseline = json.loads(BASELINE.read_text()).get("cpu", {}) if BASELINE.exists() else {}
    # Cases not shrunk here cannot lose "verified"; everything else must hold.
    baseline = {
        case: [c for c in checks if c != "verified" or case in SHRINK_IN_CI]
        for case, checks in baseline.items()
    }
    scores = run_cases(CPU_CASES, "cpu", jobs=2, timeout=240, shrink=SHRINK_IN_CI, workdir=tmp_path)
    assert len(scores) == len(CPU_CASES)
    lost = regressions(baseline, scores)
    summary = "\n".join(
        f"{s.case}: {'pass' if s.passed else 'FAIL'} {s.passing_checks()} {list(s.notes)}"
        for s in scores
    )
    assert not lost, "regressed against corpus/baseline.json:\n" + "\n".join(lost) + "\n" + summary
    unread = [s.case for s in scores if not s.facts_checked]
    assert not unread, f"the facts audit read nothing of {unread}\n{summary}"
    wrong = [f"{s.case}: {fact}" for s in scores for fact in (*s.false_facts, *s.missing_facts)]
    assert not wrong, "the facts audit:\n" + "\n".join(wrong)


EXAMPLES = [  # what examples/README.md promises
    ("train_embedding.py", 12, "IndexError", "aten::embedding"),
    ("train_classifier.py", 7, "IndexError", "aten::nll_loss_forward"),
    ("train_onehot.py", 5, "RuntimeError", "torch.nn.functional.one_hot"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "step", "error_type", "op"), EXAMPLES)
def test_examples_fail_as_documented(script: str, step: int, error_type: str, op: str) -> None:
    path = REPO / "examples" / script
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "truth_probe.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith(PROBE_MARKER))
    got = json.loads(line[len(PROBE_MARKER) :])
    ((marker_file, marker_line),) = [m for m in culprit_markers(path.parent) if m[0] == script]
    assert (got["file"], got["line"]) == (marker_file, marker_line)
    assert (got["steps"], got["error_type"]) == (step, error_type)
    assert op in (got["op"], got["public_call"])
