"""The oracle and a plain `python repro.py` agree on candidates whose failure depends on the
process: one that fails only under the environment the oracle used to set, one that fails only
in a forked child of the server. Each would have been accepted before (the first is shown with
the old, blocking oracle) and is not now; and a reduction that ends in a candidate failing only
in the oracle's processes walks back to an earlier one that verifies."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from rich.console import Console

from reprocut.check.agreement import PlainAgreement
from reprocut.check.oracle import ForkOnly, Oracle, OtherFailure, Passed, Reproduced
from reprocut.check.process_sensitive import fingerprint
from reprocut.check.verify import run_plain, verify
from reprocut.model.case import Signature, signature_to_json
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.model.signature import classify
from reprocut.pipeline.cases import Outcome
from reprocut.pipeline.recover import walk_back_outcome
from reprocut.shrink.header import Environment
from reprocut.shrink.walkback import AcceptedLog, walk_back
from reprocut.source.passes import delete_statements, shrink_integers
from reprocut.source.reducer import reduce_source

EMBEDDING = Signature("IndexError", None, "aten::embedding", "index out of range in self")

# fails only when CUDA_LAUNCH_BLOCKING=1, which every oracle child used to have
ENV_DEPENDENT = """\
import os
import torch

ids = torch.tensor([12 if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else 1])
torch.nn.functional.embedding(ids, torch.zeros(10, 4))
"""

# fails only in a forked child of the fork server: it inherits the server's modules
FORK_DEPENDENT = """\
import sys
import torch

ids = torch.tensor([12 if "reprocut" in sys.modules else 1])
torch.nn.functional.embedding(ids, torch.zeros(10, 4))
"""


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    with Oracle(EMBEDDING, timeout=60) as shared:
        yield shared


@pytest.fixture(scope="module")
def blocking_oracle() -> Iterator[Oracle]:
    """The oracle as it was: blocking launches and a sync after every op in its children."""
    with Oracle(EMBEDDING, timeout=60, launch_blocking=True) as shared:
        yield shared


def plain_fails(code: str, path: Path) -> bool:
    path.write_text(code)
    seen = run_plain(path, timeout=120).signature
    return seen is not None and seen.matches(EMBEDDING, compare_op=False)


def check(oracle: Oracle, code: str, path: Path):
    return oracle.check_source(code, filename=str(path), cwd=path.parent)


def test_env_dependent_candidate_is_judged_as_a_plain_run_judges_it(
    oracle, blocking_oracle, tmp_path
):
    script = tmp_path / "repro.py"
    assert isinstance(check(blocking_oracle, ENV_DEPENDENT, script), Reproduced)  # the old way
    assert not plain_fails(ENV_DEPENDENT, script)
    assert isinstance(check(oracle, ENV_DEPENDENT, script), Passed)  # now they agree


def test_fork_dependent_candidate_is_caught_by_a_plain_confirmation(oracle, tmp_path):
    script = tmp_path / "repro.py"
    assert isinstance(check(oracle, FORK_DEPENDENT, script), Reproduced)  # a fork alone is fooled
    assert not plain_fails(FORK_DEPENDENT, script)
    with PlainAgreement() as agreement, Oracle(EMBEDDING, timeout=60, confirm=agreement) as agreed:
        verdict = check(agreed, FORK_DEPENDENT, script)
        assert isinstance(verdict, ForkOnly) and verdict.plain is None
        honest = FORK_DEPENDENT.replace('12 if "reprocut" in sys.modules else 1', "12")
        assert isinstance(check(agreed, honest, script), Reproduced)
        assert agreement.to_json()["plain_runs"] == 2 and agreement.disagreements == 1
        again = honest.replace("zeros(10, 4)", "zeros(10, 3)")  # nothing process-sensitive moved
        assert fingerprint(again) == fingerprint(honest)
        assert isinstance(check(agreed, again, script), Reproduced)
        assert agreement.runs == 2  # no plain run for it


def test_fingerprint_sees_devices_layouts_and_pointers():
    base = 'x = torch.randn(4, device="cuda")\nk(x.data_ptr())'
    assert fingerprint(base) != fingerprint(base.replace(', device="cuda"', ""))
    assert fingerprint(base) != fingerprint(base.replace("x.data_ptr()", "0"))
    assert fingerprint("torch.sparse_coo_tensor(i, v)") != fingerprint("torch.randn(4, 4)")


def test_fingerprint_reads_what_runs_not_what_comments_say():
    """Stripping a docstring that tells of `.expand()` on CUDA changes nothing a fork runs."""
    told = (
        '"""Evaluation uses `.expand(B, -1, -1)` (CUDA only, not contiguous)."""\n'
        "def pe(x):\n"
        '    """Strides of the expanded table."""\n'
        "    return x.expand(4, 8)  # a cuda view, stride 0\n"
        'pe(torch.randn(8, device="cuda"))\n'
    )
    bare = 'def pe(x):\n    return x.expand(4, 8)\npe(torch.randn(8, device="cuda"))\n'
    assert fingerprint(told) == fingerprint(bare) == (("cuda", 1), ("device", 1), ("expand", 1))
    assert fingerprint(bare.replace('"cuda"', '"cpu"')) != fingerprint(bare)  # a string that runs
    assert fingerprint("not python: .expand(") == (("expand", 1),)


def test_the_plain_run_runs_the_candidate_as_repro_py_will_be_written(tmp_path):
    """A fork child waits for the GPU after every candidate; a script reduction's repro.py
    ends with `torch.cuda.synchronize()` for the same reason. A candidate ending right after its
    faulting launch fails in both, and its plain confirmation must run what repro.py will be:
    without that, every such candidate (jump_to_call's on the H200) was refused as fork-only.
    Here the `finish` adds the failing call itself, so only a plain run of the finished text
    can agree."""
    script = tmp_path / "repro.py"
    start = "import torch\n\nids = torch.tensor([12])\n"
    call = "torch.nn.functional.embedding(ids, torch.zeros(10, 4))\n"
    fails = start + call
    finishing = PlainAgreement(finish=lambda code: code + call)
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    with finishing:
        seen = finishing(start, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert seen is verdict and finishing.disagreements == 0
        assert script.read_text() == fails  # what ran: the finished candidate
    with PlainAgreement() as unfinished:
        seen = unfinished(start, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert isinstance(seen, ForkOnly) and unfinished.disagreements == 1


def _first_run_differs(
    marker: Path, first: str, then: str, *, imports: str = "import pathlib\n"
) -> str:
    """A candidate whose first run (no `marker` yet) runs the statement `first`, every later
    run the statement `then`."""
    return (
        f"{imports}\n"
        f"marker = pathlib.Path({str(marker)!r})\n"
        "if not marker.exists():\n"
        "    marker.write_text('1')\n"
        f"    {first}\n"
        f"{then}\n"
    )


def test_a_plain_run_that_ran_out_of_cuda_memory_runs_again_before_it_refuses(tmp_path):
    """Beside the reduction's checks (and other shrinks') a plain run can find the GPU's
    memory taken: that says nothing of the candidate. It runs once more; only what that run
    says counts. Here the first run raises CUDA's out-of-memory error, the second the bug."""
    marker = tmp_path / "ran-once"
    script = tmp_path / "repro.py"
    candidate = _first_run_differs(
        marker,
        "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')",
        "torch.nn.functional.embedding(torch.tensor([12]), torch.zeros(10, 4))",
        imports="import pathlib\nimport torch\n",
    )
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    with PlainAgreement() as agreement:
        seen = agreement(candidate, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert seen is verdict and agreement.disagreements == 0 and agreement.runs == 2
    marker.unlink()
    other = candidate.replace("torch.tensor([12])", "torch.tensor([1])")  # no bug after all
    with PlainAgreement() as agreement:
        seen = agreement(other, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert isinstance(seen, ForkOnly) and agreement.runs == 2


# what a plain run raising this error shows (torch 2.11 raises AcceleratorError, a RuntimeError)
ILLEGAL_ADDRESS = classify("RuntimeError", "CUDA error: an illegal memory access was encountered")


def test_a_faults_plain_run_that_raised_another_cuda_error_runs_again_before_it_refuses(tmp_path):
    """A memory fault's plain run that raised another CUDA error runs once more, and only a
    second disagreement refuses. Other disagreements are believed at once (a fork-only failure
    passes, or cannot find the fork's custom op)."""
    marker = tmp_path / "ran-once"
    script = tmp_path / "repro.py"
    candidate = _first_run_differs(
        marker,
        "raise RuntimeError('CUDA error: unspecified launch failure')",
        "raise RuntimeError('CUDA error: an illegal memory access was encountered')",
    )
    verdict = Reproduced(ILLEGAL_ADDRESS, "an illegal memory access was encountered", "", 1.0)
    with PlainAgreement() as agreement:
        seen = agreement(candidate, str(script), str(tmp_path), [], verdict, ILLEGAL_ADDRESS)
        assert seen is verdict and agreement.disagreements == 0 and agreement.runs == 2
    always = candidate.replace("if not marker.exists():", "if True:")
    with PlainAgreement() as agreement:
        seen = agreement(always, str(script), str(tmp_path), [], verdict, ILLEGAL_ADDRESS)
        assert isinstance(seen, ForkOnly) and agreement.runs == 2
        assert seen.plain is not None and "launch failure" in seen.plain.kind
    for other in ("raise KeyError('mylib')", "pass"):
        once = always.replace("raise RuntimeError('CUDA error: unspecified", f"{other}  # ('")
        once = once.replace("raise RuntimeError('CUDA error: an illegal", "pass  # ('")
        with PlainAgreement() as agreement:
            seen = agreement(once, str(script), str(tmp_path), [], verdict, ILLEGAL_ADDRESS)
            assert isinstance(seen, ForkOnly) and agreement.runs == 1


def test_an_illegal_address_that_landed_in_the_host_window_agrees(tmp_path, monkeypatch):
    """The same bad pointer raises CUDA's invalid address space error where it lands in the
    host's window: for an illegal memory access that plain run agrees (the candidate faults in
    a plain process too), and the check log says it was the related error. Not for another
    fault: a misaligned access is a bug of its own."""
    from reprocut.check import check_log

    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(check_log.LOG_ENV, str(log))
    script = tmp_path / "repro.py"
    landed = (
        "raise RuntimeError('CUDA driver error: CUDA_ERROR_INVALID_ADDRESS_SPACE: operation not "
        "supported on global/shared address space')\n"
    )
    verdict = Reproduced(ILLEGAL_ADDRESS, "an illegal memory access was encountered", "", 1.0)
    with PlainAgreement() as agreement:
        seen = agreement(landed, str(script), str(tmp_path), [], verdict, ILLEGAL_ADDRESS)
        assert seen is verdict and agreement.runs == 1 and agreement.disagreements == 0
    plain = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["agreed"], e.get("related")) for e in plain if e["kind"] == "plain"] == [
        (True, True)
    ]
    misaligned = classify("RuntimeError", "CUDA error: misaligned address")
    odd = Reproduced(misaligned, "misaligned address", "", 1.0)
    with PlainAgreement() as agreement:
        seen = agreement(landed, str(script), str(tmp_path), [], odd, misaligned)
        assert isinstance(seen, ForkOnly) and agreement.runs == 2


def test_a_candidate_that_may_set_the_environment_is_confirmed_in_a_fresh_interpreter(tmp_path):
    """The plain confirmation's interpreter imported torch ahead of the candidate: the same
    run for a candidate that sets no environment (importing torch changes nothing it sees),
    not for one that may set what torch's import or CUDA's start reads before it imports
    torch. Each candidate here fails only where torch was, or was not, imported before it."""
    script = tmp_path / "repro.py"
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    call = "torch.nn.functional.embedding(torch.tensor([{}]), torch.zeros(10, 4))\n"
    sets = (
        "import os\nimport sys\n\nos.environ.setdefault('OMP_NUM_THREADS', '1')\n"
        "ahead = 'torch' in sys.modules\nimport torch\n\n" + call.format("1 if ahead else 12")
    )
    plain = "import sys\n\nahead = 'torch' in sys.modules\nimport torch\n\n" + call.format(
        "12 if ahead else 1"
    )
    with PlainAgreement() as agreement:
        assert agreement(sets, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
    with PlainAgreement() as agreement:  # the interpreter started ahead ran it
        assert agreement(plain, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict


def test_plain_runs_stop_once_their_share_of_the_time_is_spent(tmp_path):
    """After `max_seconds` of plain runs the oracle's verdict stands (the final verification
    and the walk-back answer for later candidates); the first run is always made."""
    script = tmp_path / "repro.py"
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    passes = "import torch\n\nx = torch.zeros(1)\n"
    with PlainAgreement(max_seconds=0.0) as limited:
        first = limited(passes, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert isinstance(first, ForkOnly) and limited.runs == 1  # ran, and disagreed
        moved = passes.replace("zeros(1)", 'zeros(1, device="cpu")')  # a new fingerprint
        assert limited(moved, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert limited.runs == 1


def test_a_scripts_plain_run_goes_beside_the_reduction_and_a_refusal_reaches_the_reducer(
    tmp_path,
):
    """`beside=True` (a script reduction): the verdict stands at once and the plain run goes on
    a thread; one that disagrees is handed over by `refused`, and the next candidate needing a
    run, made from the refused one, is refused as well. One that agrees hands over nothing."""
    script = tmp_path / ".reprocut-candidate-train.py"
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    passes = "import torch\n\nx = torch.zeros(1)\n"
    fails = (
        "import torch\n\ntorch.nn.functional.embedding(torch.tensor([12]), torch.zeros(10, 4))\n"
    )
    with PlainAgreement(beside=True) as agreement:
        started = time.perf_counter()
        assert agreement(passes, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert time.perf_counter() - started < 0.5  # no plain run waited for
        moved = passes.replace("zeros(1)", 'zeros(1, device="cpu")')  # a new fingerprint
        later = agreement(moved, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert isinstance(later, ForkOnly)  # the run before it disagreed: it waited for that
        assert agreement.refused() == passes and agreement.refused(wait=True) is None
        assert agreement.runs == 1 and agreement.disagreements == 1
    with PlainAgreement(beside=True) as agreeing:
        agreeing.trust(moved)  # the user's script: it failed in their own run
        assert agreeing(fails, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert agreeing(moved, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert agreeing.refused(wait=True) is None and agreeing.runs == 1  # none for the script
        assert agreeing.confirmed == fingerprint(fails)
    assert not list(tmp_path.glob(".reprocut-plain-*"))  # each run's own file, removed


def test_a_refused_candidate_takes_the_reduction_back_to_before_it():
    """The reducer goes back to the best before a candidate a late plain run refused and never
    tries that one again; what was accepted after it may come back on its own merits: the
    reduction still ends at a fixed point as small as without the refusal."""
    from reprocut.source.fixed_point import SourceReducer
    from reprocut.source.passes import PassContext
    from reprocut.source.results import SourceAccepted

    expected = Signature("ValueError", None, None, "bad")
    source = 'a = 1\nb = 2\nraise ValueError("bad")\n'

    def check(code: str) -> Signature | None:
        try:
            exec(compile(code, "<candidate>", "exec"), {})
        except ValueError as exc:
            return Signature("ValueError", None, None, str(exc))
        return None

    accepted: list[str] = []
    handed: list[str] = []

    def refused(wait: bool) -> str | None:
        if len(accepted) >= 2 and not handed:  # after the second, the first is refused
            handed.append(accepted[0])
            return accepted[0]
        return None

    reducer = SourceReducer(
        best=source, expected=expected, check=check, context=PassContext(ways=2),
        passes=[delete_statements], refused=refused,
        on_event=lambda e: accepted.append(e.code) if isinstance(e, SourceAccepted) else None,
    )  # fmt: skip
    assert reducer.run() == "fixed point"
    assert handed == ['a = 1\nraise ValueError("bad")\n']
    assert accepted.count(handed[0]) == 1  # never accepted again
    assert reducer.best == 'raise ValueError("bad")\n'  # reached again, the other way round
    assert 'b = 2\nraise ValueError("bad")\n' in accepted


# Deleting the last `ids = ...` leaves the first, whose id is out of range only in a fork
# child of reprocut's server: that candidate fails in the oracle and not in a plain run. It
# drops a device word, so its plain run goes beside the reduction and refuses it late.
LATE_REFUSAL = """\
import sys

import torch

real = 12
ids = torch.tensor([12 if "reprocut" in sys.modules else 1])
ids = torch.tensor([real], device="cpu")
torch.nn.functional.embedding(ids, torch.zeros(10, 4))
"""


def test_a_script_reduction_goes_back_when_a_plain_run_beside_it_refuses_a_candidate(tmp_path):
    """Real processes end to end: the fork-only candidate is accepted at once, its plain run
    beside the reduction disagrees, the reducer goes back to before it, and the result fails
    in a plain run as the user's script did."""
    script = tmp_path / "train.py"
    script.write_text(LATE_REFUSAL)
    with (
        PlainAgreement(beside=True) as agreement,
        Oracle(EMBEDDING, timeout=60, confirm=agreement) as agreed,
    ):
        agreement.trust(LATE_REFUSAL)
        result = reduce_source(
            script, cwd=tmp_path, argv=[], expected=EMBEDDING, oracle=agreed,
            passes=(delete_statements,), max_time=240,
        )  # fmt: skip
    assert agreement.disagreements >= 1
    assert 'device="cpu"' in result.code and "sys.modules" not in result.code
    assert plain_fails(result.code, tmp_path / "final.py")


def test_a_script_reductions_plain_runs_end_by_waiting_for_the_gpu(oracle, tmp_path):
    from reprocut.model.recording import ErrorInfo, Failure
    from reprocut.pipeline.recover import agree

    script = tmp_path / "train.py"
    script.write_text('import torch\nx = torch.ones(2, device="cuda")\n')
    failure = Failure(
        status="outside-dispatcher",
        error=ErrorInfo("AcceleratorError", "an illegal memory access was encountered", 700),
        signature=Signature("AcceleratorError", 700, None, "an illegal memory access"),
        script=str(script),
    )
    confirm = oracle.confirm
    try:
        agreement, _ = agree(oracle, failure, tmp_path / "out", source=True, timeout=60)
        with agreement:
            assert agreement.finish is not None
            finished = agreement.finish(script.read_text())
        assert finished.rstrip().endswith("torch.cuda.synchronize()")
        ops, _ = agree(oracle, failure, tmp_path / "out2", source=False, timeout=60)
        with ops:
            assert ops.finish is None  # an op-level repro is emitted with its own wait
    finally:
        oracle.confirm = confirm


@pytest.mark.cuda
def test_a_candidate_ending_at_its_faulting_launch_is_confirmed_on_the_gpu(tmp_path):
    """The jump's candidates end at the faulting launch: the fork child fails at its closing
    wait, and the plain confirmation of the finished candidate agrees."""
    from reprocut.source.finish import ending_with_a_sync

    script = tmp_path / "repro.py"
    code = (
        "import torch\n\n"
        'ids = torch.tensor([12], device="cuda")\n'
        'torch.nn.functional.embedding(ids, torch.zeros(10, 4, device="cuda"))\n'
    )
    script.write_text(ending_with_a_sync(code))
    assert_sig = run_plain(script, timeout=120).signature  # what the finished repro fails with
    assert assert_sig is not None and assert_sig.error_code == 710, assert_sig
    with (
        PlainAgreement(finish=ending_with_a_sync) as agreement,
        Oracle(assert_sig, timeout=120, confirm=agreement) as agreed,
    ):
        verdict = check(agreed, code, script)
        assert isinstance(verdict, Reproduced), verdict
        assert agreement.runs == 1 and agreement.disagreements == 0


# --- the walk-back --------------------------------------------------------------------------

# The shift is 10 only in processes with CUDA_LAUNCH_BLOCKING=1 (the old oracle's): there every
# id is out of range, so its reduction shrinks the ids below the table size, where a plain run
# no longer fails. The table's size is no integer literal, so shrink_integers cannot cut it;
# it shrinks the last integers first, so the ids go before the shift.
SHIFTED = """\
import os

import torch


def main():
    table = torch.zeros(int("10"), 4)
    noise = torch.randn(3)
    print(noise.sum().item())
    shift = len(os.environ.get("CUDA_LAUNCH_BLOCKING", "")) * 10
    ids = [2, 12]
    torch.nn.functional.embedding(torch.tensor(ids) + shift, table)


main()
"""


def reduce_logged(oracle: Oracle, tmp_path: Path) -> tuple[AcceptedLog, str]:
    script = tmp_path / "train.py"
    script.write_text(SHIFTED)
    log = AcceptedLog(tmp_path / "accepted")
    log.start_source(SHIFTED)
    result = reduce_source(
        script, cwd=tmp_path, argv=[], expected=EMBEDDING, oracle=oracle,
        passes=(delete_statements, shrink_integers), on_event=log.watch(lambda event: None),
        max_time=240,
    )  # fmt: skip
    return log, result.code


def test_a_reduction_whose_last_candidates_fail_only_in_the_oracle_walks_back(
    blocking_oracle, tmp_path
):
    log, final = reduce_logged(blocking_oracle, tmp_path)
    assert "[0, 0]" in final and not plain_fails(final, tmp_path / "final.py")

    def reproduces(path: Path) -> bool:
        seen = run_plain(path, timeout=120).signature
        return seen is not None and seen.matches(EMBEDDING, compare_op=False)

    def verifies(path: Path) -> bool:
        return verify(path, EMBEDDING, runs=2, timeout=120).reproduced == 2

    walked = walk_back(log, reproduces=reproduces, verifies=verifies)
    assert walked.chosen is not None and 0 < walked.chosen.index < len(log.entries) - 1
    chosen = walked.chosen.path.read_text()
    assert "12" in chosen and "noise" not in chosen  # smaller than the start, and it fails
    following = log.entries[walked.chosen.index + 1].path
    assert not reproduces(following)  # the next one is where the processes disagreed
    assert walked.probes <= 2 + len(log.entries).bit_length()
    # as shrink does it: the chosen one written, the final one kept beside it with what it did
    out = tmp_path / "out"
    out.mkdir()
    final_path = out / "repro.py"
    final_path.write_text(final)
    outcome = Outcome(code=final, statements=0, tensor_elements=None, checks=0, sidecar=False)
    failure = Failure.from_json(
        {"status": "failed", "error": ErrorInfo("IndexError", "").to_json(),
         "signature": signature_to_json(EMBEDDING)}
    )  # fmt: skip
    failed_plainly = verify(final_path, EMBEDDING, runs=2, timeout=120)
    chosen_outcome, verified, pipeline_walk = walk_back_outcome(
        log, outcome, failed_plainly, failure, {}, Environment(), runs=2, timeout=120, out=out,
        console=Console(file=io.StringIO()),
    )  # fmt: skip
    assert verified.reproduced == 2 and "12" in chosen_outcome.code
    refused = pipeline_walk.to_json()["refused"]
    assert (out / refused["file"]).read_text() == final
    assert refused["exit"] == 0 and refused["signature"] is None  # it ran without failing


def test_the_same_reduction_with_todays_oracle_ends_in_a_repro_that_verifies(oracle, tmp_path):
    _, final = reduce_logged(oracle, tmp_path)
    script = tmp_path / "final.py"
    assert plain_fails(final, script) and "noise" not in final
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert "index out of range" in done.stderr


def test_a_case_that_needs_blocking_launches_sets_them_before_torch_is_imported(tmp_path):
    """The one environment a repro may need comes with it, so a fork child (which runs the
    code before it starts CUDA) and a plain run both have it."""
    from reprocut.model.case import Literal, ReproCase, TensorSpec
    from reprocut.shrink.emitter import emit

    case = ReproCase(
        "torch.nn.functional.embedding",
        (TensorSpec((1,), dtype="int64", values=Literal((12,))), TensorSpec((10, 4))),
        env=(("CUDA_LAUNCH_BLOCKING", "1"),),
    )
    code = emit(case).code
    body = code.split('"""\n', 2)[-1]
    assert body.index('os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")') < body.index(
        "import torch"
    )
    assert "Environment: CUDA_LAUNCH_BLOCKING=1" in code
    assert plain_fails(code, tmp_path / "repro.py")


def test_a_captured_aten_calls_first_plain_run_goes_beside_the_shrink(tmp_path):
    """reprocut's own captured call of aten ops: its first plain run does not hold up the
    shrink (settle gives its answer), and a candidate that only drops process-sensitive parts
    needs none; one that adds such a part still gets one."""
    script = tmp_path / "repro.py"
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    fails = (
        'import torch\n\nids = torch.tensor([12], device="cpu")\n'
        'torch.nn.functional.embedding(ids, torch.zeros(10, 4, device="cpu"))\n'
    )
    with PlainAgreement(captured=True) as agreement:
        assert agreement(fails, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert agreement.runs == 0  # still running beside
        script.write_text("raise SystemExit(0)\n")  # the oracle's next candidate: not what runs
        assert agreement.settle() is None and agreement.runs == 1
        assert agreement.disagreements == 0
        fewer = fails.replace(', device="cpu"))', "))")
        assert agreement(fewer, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert agreement.runs == 1  # only removed a device: no plain run
        more = fails.replace("embedding(ids,", "embedding(ids.contiguous(),")
        assert agreement(more, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert agreement.runs == 2  # a new process-sensitive word: a plain run


def test_a_first_plain_run_beside_the_shrink_that_disagrees_refuses_what_followed(tmp_path):
    script = tmp_path / "repro.py"
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    with PlainAgreement(captured=True) as agreement:
        assert (
            agreement(FORK_DEPENDENT, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        )
        refused = agreement.settle()
        assert isinstance(refused, ForkOnly) and agreement.disagreements == 1
        later = agreement(FORK_DEPENDENT + "\n", str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert isinstance(later, ForkOnly)  # built on a candidate that fails in a fork alone
        agreement.start_scripts()  # the script is reduced next: its candidates start afresh
        assert agreement.settle() is None


def test_a_custom_op_candidates_first_plain_run_goes_beside_later_ones_come_first(tmp_path):
    """The recorded call of a custom op is run plainly beside the shrink (its answer, from
    settle, decides whether anything shrunk counts); a later candidate with a new
    process-sensitive part waits for that answer, and is confirmed before the shrink goes on."""
    script = tmp_path / "repro.py"
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    custom = "import torch\n\ntorch.ops.mylib.pad_rows(torch.zeros(2))\n"
    with PlainAgreement(captured=True) as agreement:
        assert agreement(custom, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        refused = agreement.settle()  # torch.ops.mylib does not exist in a plain run
        assert isinstance(refused, ForkOnly) and agreement.runs == 1
    with PlainAgreement(captured=True) as agreement:
        agreement(custom, str(script), str(tmp_path), [], verdict, EMBEDDING)
        later = custom.replace("torch.zeros(2)", 'torch.zeros(2, device="cpu")')
        seen = agreement(later, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert isinstance(seen, ForkOnly) and agreement.runs == 1  # waited for the first
    fails = (  # a library that may read raw memory: not an aten call alone
        'import ctypes\nimport torch\n\nids = torch.tensor([12], device="cpu")\n'
        'torch.nn.functional.embedding(ids, torch.zeros(10, 4, device="cpu"))\n'
    )
    with PlainAgreement(captured=True) as agreement:
        agreement(fails, str(script), str(tmp_path), [], verdict, EMBEDDING)
        later = fails.replace("embedding(ids,", "embedding(ids.contiguous(),")
        seen = agreement(later, str(script), str(tmp_path), [], verdict, EMBEDDING)
        assert seen is verdict and agreement.runs == 2  # the first agreed; this one ran now


def _warmed_at_a_cuda_error() -> Oracle:
    """record's warm oracle, as it is once the script printed its first CUDA error."""
    from reprocut.check.warmer import OracleWarmer

    warmer = OracleWarmer(timeout=30)
    warmer.on_line("RuntimeError: CUDA error: device-side assert triggered")
    oracle = warmer.ready()
    deadline = time.monotonic() + 60
    while oracle.plain_ahead is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return oracle


def test_records_plain_interpreter_started_ahead_serves_the_shrinks_first_plain_run(tmp_path):
    """`record --shrink`: at the script's first CUDA error the warmer starts a plain
    interpreter (its torch import takes seconds on a GPU machine), and the shrink's agreement
    takes it over; one the shrink never takes ends with the oracle."""
    from reprocut.pipeline.recover import agree

    oracle = _warmed_at_a_cuda_error()
    ahead = oracle.plain_ahead
    assert ahead is not None
    failure = Failure.from_json(
        {"status": "failed", "error": ErrorInfo("IndexError", "").to_json(),
         "signature": signature_to_json(EMBEDDING)}
    )  # fmt: skip
    agreement, _ = agree(oracle, failure, tmp_path, source=False, timeout=60)
    assert agreement.runner is ahead and oracle.plain_ahead is None
    script = tmp_path / "repro.py"
    fails = (
        "import torch\n\ntorch.nn.functional.embedding(torch.tensor([12]), torch.zeros(10, 4))\n"
    )
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    with agreement:
        assert agreement(fails, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert agreement.settle() is None and ahead.runs == 1  # it ran in the one started ahead
    oracle.close(wait=False)
    untaken = _warmed_at_a_cuda_error()
    process = untaken.plain_ahead._standby.process
    untaken.close(wait=False)
    assert untaken.plain_ahead is None and process.wait(timeout=30) is not None


def test_a_plain_run_that_would_go_past_the_bound_at_the_mean_so_far_is_not_started(tmp_path):
    """With the bound between one and two runs' time, the first run is made and a second is
    not: it would take the plain runs past their bound."""
    script = tmp_path / "repro.py"
    verdict = Reproduced(EMBEDDING, "index out of range in self", "", 1.0)
    fails = (
        "import torch\n\ntorch.nn.functional.embedding(torch.tensor([12]), torch.zeros(10, 4))\n"
    )
    with PlainAgreement(max_seconds=1e9) as bounded:
        assert bounded(fails, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert bounded.runs == 1 and bounded.seconds > 0
        bounded.max_seconds = bounded.seconds * 1.5  # room left, but not for one more run
        moved = fails.replace("zeros(10, 4)", 'zeros(10, 4, device="cpu")')  # a new fingerprint
        assert bounded(moved, str(script), str(tmp_path), [], verdict, EMBEDDING) is verdict
        assert bounded.runs == 1


@pytest.mark.parametrize("ways", [2, 4])
@pytest.mark.parametrize("last_good", [0, 1, 7, 18, 28])
def test_the_walk_back_finds_the_latest_candidate_that_reproduces_probing_each_once(
    tmp_path: Path, ways: int, last_good: int
) -> None:
    """Candidates 0..last_good reproduce, later ones do not (the 30th, the final, is known not
    to): the search settles on last_good, probes no candidate twice, and cut four ways (probes
    side by side, on a machine with cores to spare) takes fewer rounds than a bisection."""
    log = AcceptedLog(tmp_path / "accepted")
    for index in range(30):
        log.add_code(f"index = {index}\n")
    probed: list[int] = []
    rounds: list[float] = []

    def reproduces(script: Path) -> bool:
        index = int(script.read_text().split("=")[1])
        probed.append(index)
        rounds.append(time.monotonic())
        time.sleep(0.05)  # the probes of one round overlap
        return index <= last_good

    walked = walk_back(log, reproduces=reproduces, verifies=lambda script: True, ways=ways)
    assert walked.chosen is not None and walked.chosen.index == last_good
    assert len(probed) == len(set(probed)) == walked.probes
    assert walked.probes <= (2 + (29).bit_length() if ways == 2 else 3 * 4)
    starts = sorted(rounds)  # the probes of one round start together
    groups = 1 + sum(1 for a, b in itertools.pairwise(starts) if b - a > 0.03)
    assert groups == walked.probes if ways == 2 else groups <= 4


@pytest.mark.parametrize("ways", [2, 4])
def test_a_walk_back_whose_first_choice_is_flaky_looks_further_back(
    tmp_path: Path, ways: int
) -> None:
    """Candidate 9 reproduces once but does not verify (the H200's exit_guard repro: 1 of 3
    plain runs): the walk looks further back, without probing candidate 0 again, and settles
    on the latest that verifies."""
    log = AcceptedLog(tmp_path / "accepted")
    for index in range(12):
        log.add_code(f"index = {index}\n")
    probed: list[int] = []

    def index_of(script: Path) -> int:
        return int(script.read_text().split("=")[1])

    def reproduces(script: Path) -> bool:
        probed.append(index_of(script))
        return index_of(script) <= 9

    walked = walk_back(
        log, reproduces=reproduces, verifies=lambda script: index_of(script) <= 7, ways=ways
    )
    assert walked.chosen is not None and walked.chosen.index == 7
    assert probed.count(0) == 1 and walked.reason == "verified"


def test_a_walked_back_case_keeps_the_unshrunk_calls_sizes_in_its_header(tmp_path):
    """The walk-back writes an earlier case under the header the final one had: the error, its
    message, and `Original:` (the unshrunk call's sizes), even where the chosen case's script
    was rendered before under a bare header (the original's memcheck renders the first)."""
    from reprocut.model.case import Literal, ReproCase, TensorSpec
    from reprocut.shrink.emitter import emit

    def embedding(ids: tuple[int, ...], rows: int) -> ReproCase:
        index = TensorSpec((len(ids),), dtype="int64", values=Literal(ids))
        return ReproCase("torch.nn.functional.embedding", (index, TensorSpec((rows, 4))))

    log = AcceptedLog(tmp_path / "accepted")
    for case in (embedding((1, 12, 2), 10), embedding((12,), 10), embedding((0,), 1)):
        log.add_case(case)
    log.entries[1].path.write_text(emit(log.entries[1].case).code)  # a bare header, ahead
    out = tmp_path / "out"
    out.mkdir()
    final = emit(log.entries[-1].case).code
    (out / "repro.py").write_text(final)
    failure = Failure.from_json(
        {"status": "failed", "error": ErrorInfo("IndexError", "index out of range in self").to_json(),
         "signature": signature_to_json(EMBEDDING)}
    )  # fmt: skip
    outcome = Outcome(code=final, statements=0, tensor_elements=None, checks=0, sidecar=False)
    failed_plainly = verify(out / "repro.py", EMBEDDING, runs=2, timeout=120)
    assert failed_plainly.reproduced == 0  # index 0 of one row: no failure
    chosen, verified, walked = walk_back_outcome(
        log, outcome, failed_plainly, failure, {}, Environment(), runs=2, timeout=120, out=out,
        console=Console(file=io.StringIO()),
    )  # fmt: skip
    assert walked is not None and walked.chosen is not None and walked.chosen.index == 1
    assert verified.reproduced == 2
    written = (out / "repro.py").read_text()
    assert written == chosen.code
    assert "Message: index out of range in self" in written
    assert "Original: " in written and "(3,)" in written  # the unshrunk ids' size


def test_a_check_whose_bad_address_landed_in_the_host_window_reproduces(tmp_path):
    """A candidate's check, not only its plain run: the invalid address space error stands for an
    illegal memory access (on an H100, 15 checks of cuda_cupy_host_pointers raised it in one call
    and were refused as other failures). A misaligned access is still a bug of its own."""
    landed = (
        "raise RuntimeError('CUDA driver error: CUDA_ERROR_INVALID_ADDRESS_SPACE: operation not "
        "supported on global/shared address space')\n"
    )
    misaligned = classify("RuntimeError", "CUDA error: misaligned address")
    with Oracle(timeout=60) as oracle:
        run = partial(oracle.check_source, landed, filename=str(tmp_path / "c.py"), cwd=tmp_path)
        assert isinstance(run(expected=ILLEGAL_ADDRESS), Reproduced)
        assert isinstance(run(expected=misaligned), OtherFailure)
