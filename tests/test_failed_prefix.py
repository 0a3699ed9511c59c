"""A candidate beginning with the code up to where a checked one raised is not run
(reprocut.source.failed_prefix): real checks by the fork server, a real reduction."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pure_candidates import BAD

from benchmarks.check_log_summary import read_events, summarize
from reprocut.check.oracle import Oracle, OtherFailure
from reprocut.model.case import Signature
from reprocut.source.failed_prefix import FailedPrefixes
from reprocut.source.reducer import reduce_source


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip()


@pytest.fixture(scope="module")
def oracle():
    with Oracle(timeout=60) as oracle:
        yield oracle


def check(oracle: Oracle, text: str, tmp_path: Path):
    return oracle.check_source(text, filename=str(tmp_path / "candidate.py"), cwd=tmp_path)


PRELUDE = code("""
    import os

    def helper(x):
        return x + 1

    path = os.path.join("a", None)
    helper(1)
""")


def test_the_verdict_says_which_module_level_line_raised(oracle: Oracle, tmp_path: Path):
    verdict = check(oracle, PRELUDE, tmp_path)
    assert isinstance(verdict, OtherFailure) and verdict.signature.error_type == "TypeError"
    assert verdict.line == 6  # inside os.path.join, called from line 6 of the module
    nested = PRELUDE.replace("return x + 1", "return x + None").replace('"a", None', '"a"')
    assert check(oracle, nested, tmp_path).line == 7  # raised in helper, called from line 7
    assert check(oracle, "x = (\n", tmp_path).line is None  # a syntax error runs no line


def test_code_beginning_with_the_same_statements_is_covered_and_other_code_is_not(
    oracle: Oracle, tmp_path: Path
):
    failed = FailedPrefixes()
    assert failed.add(PRELUDE, check(oracle, PRELUDE, tmp_path))
    assert failed.covers(PRELUDE.replace("helper(1)", "helper(2)\nprint('more')"))
    assert failed.covers(PRELUDE.replace("helper(1)\n", ""))
    assert not failed.covers(PRELUDE.replace('"a", None', '"a", "b"'))  # that statement changed
    assert not failed.covers(PRELUDE.replace("x + 1", "x + 2"))  # code before it changed
    assert not failed.covers(PRELUDE.replace("import os\n", ""))


def test_a_clause_added_to_the_statement_that_raised_is_not_covered(oracle: Oracle, tmp_path: Path):
    raising = code("""
        try:
            int("x")
        except KeyError:
            pass
    """)
    failed = FailedPrefixes()
    assert failed.add(raising, check(oracle, raising, tmp_path))
    assert failed.covers(raising + "print('after')\n")
    # the same lines, then a clause that catches what they raised
    assert not failed.covers(raising + "except ValueError:\n    pass\n")


def test_a_failure_where_the_best_runs_the_same_code_is_the_runs_not_the_codes(
    oracle: Oracle, tmp_path: Path
):
    """The candidate raised in code the best (which reproduces) runs as it is: one of the two
    runs went otherwise (a flaky read), and keeping it would refuse every later edit."""
    verdict = check(oracle, PRELUDE, tmp_path)
    best = PRELUDE.replace("helper(1)", "helper(1)\nprint('the failing call')")
    failed = FailedPrefixes()
    assert not failed.add(PRELUDE, verdict, best=best) and len(failed) == 0
    assert failed.add(PRELUDE, verdict, best=best.replace('"a", None', '"a", "b"'))


def test_a_failure_another_run_may_not_repeat_is_not_kept():
    cuda = Signature("AcceleratorError", 700, None, "an illegal memory access was encountered")
    oom = Signature("OutOfMemoryError", None, None, "CUDA out of memory. Tried to allocate <n>")
    driver = Signature("CUDADriverError", None, None, "CUDA_ERROR_INVALID_ADDRESS_SPACE: ...")
    failed = FailedPrefixes()
    for signature in (cuda, oom, driver):
        verdict = OtherFailure(signature, signature.kind, "", 1.0, line=1)
        assert not failed.add("x = 1\n", verdict)
    assert not failed.add("x = 1\n", OtherFailure(BAD, "bad value 3", "", 1.0))  # no line
    assert len(failed) == 0


VENDORED = {
    "train.py": code('''
        """Normalise each step's frames with a vendored kernel (rows of 4 values only)."""
        import os
        import sys

        import numpy as np

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
        from vecext import normalise


        def frames(step):
            rng = np.random.default_rng(step)
            return rng.standard_normal(16 if step < 3 else 18)


        for step in range(5):
            x = frames(step)
            normalise(x, float(x.mean()), float(x.std()))
            print(step)
    '''),
    "vendor/vecext.py": code("""
        def normalise(x, mean, std):
            if len(x) % 4:
                raise ValueError(f"bad value {len(x)}")
            return (x - mean) / std
    """),
}


def reduce_vendored(tmp_path: Path, parallel: int = 1):
    for name, text in VENDORED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return reduce_source(
        tmp_path / "train.py", cwd=tmp_path, argv=[], expected=BAD, parallel=parallel, timeout=60
    )


def test_a_reduction_skips_the_candidates_that_would_raise_where_others_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, oracle: Oracle
):
    covered: list[str] = []
    covers = FailedPrefixes.covers

    def watched(self: FailedPrefixes, candidate: str) -> bool:
        found = covers(self, candidate)
        if found:
            covered.append(candidate)
        return found

    monkeypatch.setattr(FailedPrefixes, "covers", watched)
    monkeypatch.setenv("REPROCUT_CHECK_LOG", str(tmp_path / "checks.jsonl"))
    skipping = reduce_vendored(tmp_path / "skipping")
    monkeypatch.delenv("REPROCUT_CHECK_LOG")
    monkeypatch.setattr(FailedPrefixes, "covers", lambda self, candidate: False)
    running = reduce_vendored(tmp_path / "running")

    assert skipping.known_failures == len(covered) > 0 and running.known_failures == 0
    assert skipping.code == running.code  # the same repro...
    assert skipping.checks <= running.checks - len(covered)  # ...for fewer checks
    assert "sys.path.insert" in skipping.code and "normalise(" in skipping.code
    for candidate in covered:  # each candidate not run would have raised another failure
        folder = tmp_path / "skipping"
        verdict = oracle.check_source(candidate, filename=str(folder / "train.py"), cwd=folder,
                                      expected=BAD)  # fmt: skip
        assert isinstance(verdict, OtherFailure), candidate
    # the check log's summary counts them per pass and says what the other failures were
    summary = summarize(read_events(tmp_path / "checks.jsonl"))
    assert summary.total().known == skipping.known_failures
    assert any("No module named 'vecext'" in what for what in summary.failures)


def test_a_check_log_without_passes_sums_up():
    summary = summarize([{"t": 1.0, "kind": "phase", "phase": "read", "seconds": 0.1}])
    assert summary.total().runs == 0 and summary.phases == {"read": 0.1}
