"""The CPU check of accepted cases runs beside the shrink: repro.py's CPU line is the final
case's, one check is in flight at a time, and the shrinker's own budget is untouched."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from reprocut.check.oracle import Cancelled, Oracle, Passed, Verdict
from reprocut.model.case import Generated, ReproCase, TensorSpec
from reprocut.model.recording import ErrorInfo, Failure
from reprocut.pipeline.cases import BEST_FILE, shrink_case
from reprocut.pipeline.cpu_check import CpuBeside, cpu_behaviour
from reprocut.pipeline.phases import Phases
from reprocut.shrink.header import Environment
from reprocut.shrink.shrinker import ShrinkEvent


def meta_mm(rows: int = 8) -> ReproCase:
    """torch.mm of mismatched meta tensors: fails here without a GPU, and on the CPU with
    another message, which names the shapes (so it tells which case it was asked of)."""
    return ReproCase(
        "torch.mm",
        (
            TensorSpec((rows, 4), device="meta", values=Generated("randn")),
            TensorSpec((3, 2), device="meta", values=Generated("randn")),
        ),
    )


def meta_failure(oracle: Oracle) -> Failure:
    verdict = oracle.check_case(meta_mm())
    signature = verdict.signature  # type: ignore[union-attr]
    case = ReproCase(meta_mm().target, meta_mm().args, expected=signature, aten_op=signature.op)
    return Failure(
        status="localized",
        error=ErrorInfo(signature.error_type, verdict.message),  # type: ignore[union-attr]
        signature=signature,
        op=signature.op,
        public_call=case.target,
        cases=(case,),
        device="meta",
    )


def test_the_header_has_the_final_cases_cpu_answer_checked_beside(tmp_path: Path) -> None:
    with Oracle(timeout=60) as oracle:
        outcome = shrink_case(
            meta_failure(oracle), {}, oracle, max_checks=100, max_time=120, out=tmp_path,
            environment=Environment(), on_event=lambda event: None, phases=Phases(),
        )  # fmt: skip
        best = ReproCase.loads((tmp_path / BEST_FILE).read_text())
        assert best.total_numel() < meta_mm().total_numel()  # it did shrink
        assert outcome.cpu_checked_beside
        serial = cpu_behaviour(best, {}, oracle)  # what the check after the shrink would say
    assert (outcome.cpu_reproduces, outcome.cpu_message) == serial
    assert outcome.cpu_message.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert f"CPU: reproduces too ({outcome.cpu_message})" in outcome.code


def test_the_cpu_checks_beside_leave_the_shrinkers_budget_alone(tmp_path: Path) -> None:
    events: list[ShrinkEvent] = []
    with Oracle(timeout=60) as oracle:
        outcome = shrink_case(
            meta_failure(oracle), {}, oracle, max_checks=3, max_time=120, out=tmp_path,
            environment=Environment(), on_event=events.append, phases=Phases(),
        )  # fmt: skip
    assert outcome.stopped == "max checks"
    assert sum(event.kind == "check" for event in events) == 3


class SlowOracle:
    """Checks that wait for `release` (or their cancellation, once `notice` is set), counting
    how many run at once."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.release = threading.Event()
        self.notice = threading.Event()
        self.asked: list[int] = []  # the first dimension of each case checked
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def check_case(self, case: ReproCase, inputs: Any, **options: Any) -> Verdict:
        assert options["workdir"] != self.workdir and options["leave_standby"]
        with self._lock:
            self.asked.append(case.args[0].shape[0])  # type: ignore[union-attr]
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            while not self.release.wait(0.01):
                if options["ticket"].cancelled and self.notice.is_set():
                    return Cancelled(0.0)
            return Passed(0.0)
        finally:
            with self._lock:
                self.running -= 1


def wait_until(condition: Any) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_newer_case_supersedes_the_one_waiting_and_cancels_the_one_running(
    tmp_path: Path,
) -> None:
    oracle = SlowOracle(tmp_path)
    beside = CpuBeside({}, oracle)  # type: ignore[arg-type]
    beside.submit(meta_mm(8))
    wait_until(lambda: oracle.asked == [8])
    beside.submit(meta_mm(6))  # cancels 8's check
    beside.submit(meta_mm(4))  # 6's never starts
    oracle.notice.set()
    wait_until(lambda: oracle.asked == [8, 4])
    beside.submit(meta_mm(4))  # already in flight: not asked again
    oracle.release.set()
    assert beside.answer_for(meta_mm(4)) == (False, "runs without error")
    assert beside.answer_for(meta_mm(8)) is None  # cancelled: no answer kept
    assert oracle.asked == [8, 4] and oracle.most == 1 and beside.checks == 2


def test_case_checks_side_by_side_reach_the_one_at_a_time_repro(tmp_path: Path) -> None:
    """Two slots, each checking in a folder of its own by the fork server: the minimal case one
    check at a time reaches (what the H200's four slots rely on; the same trail is checked
    against a pure predicate in test_shrinker.py)."""
    with Oracle(timeout=60) as oracle:
        outcome = shrink_case(
            meta_failure(oracle), {}, oracle, max_checks=100, max_time=None, out=tmp_path,
            slots=2, environment=Environment(), on_event=lambda event: None, phases=Phases(),
        )  # fmt: skip
        assert (oracle.workdir / "slots" / "1").is_dir()  # the second slot's folder was used
    best = ReproCase.loads((tmp_path / BEST_FILE).read_text())
    assert outcome.stopped == "fixed point" and outcome.slots == 2  # (shrink's JSON: "slots")
    assert [spec.shape for _, spec in best.tensors()] == [(1, 1), (2, 1)]
    assert {spec.values for _, spec in best.tensors()} == {Generated("zeros")}


def test_a_memory_faults_captured_call_goes_side_by_side_unless_its_tensors_are_large(
    tmp_path: Path,
) -> None:
    """An access past a tensor faults in its own process, whatever the other slots hold: a
    memory fault's checks go side by side (a Triton op's 68 checks took 266 s one at a time on
    the H200), unless each slot would hold gigabytes; an out-of-memory never does."""
    from dataclasses import replace

    from reprocut.model.case import Signature
    from reprocut.model.memory import MemoryReport
    from reprocut.pipeline.case_checks import SIDE_BY_SIDE_BYTES, case_bytes, side_by_side

    fault = Signature("AcceleratorError", None, 700, "an illegal memory access was encountered")
    transposed = TensorSpec((8, 64, 1024, 16), stride=(1048576, 16, 1024, 1), device="cuda:0")
    small = ReproCase("torch.ops.qknorm.rms_scale.default", (transposed, TensorSpec((16,))))
    assert case_bytes(small) == (8 * 64 * 1024 * 16 + 16) * 4
    large = ReproCase("torch.index_select", (TensorSpec((1 << 28,), device="cuda:0"),
                                             TensorSpec((1 << 20,), dtype="int64")))  # fmt: skip
    assert case_bytes(large) > SIDE_BY_SIDE_BYTES
    failure = Failure("localized", ErrorInfo("AcceleratorError", fault.kind), fault,
                      cases=(small,), device="cuda:0")  # fmt: skip
    oracle = Oracle(timeout=60)
    try:
        assert side_by_side(oracle, failure, {}, fault, slots=4) is not None
        assert side_by_side(oracle, replace(failure, cases=(large,)), {}, fault, slots=4) is None
        oom = replace(failure, memory=MemoryReport(device="cuda:0", requested_bytes=1 << 34))
        assert side_by_side(oracle, oom, {}, fault, slots=4) is None
        assert side_by_side(oracle, failure, {}, fault, slots=1) is None
    finally:
        oracle.close()


CUDA_ONLY = """\
import torch


@torch.library.custom_op("demo::cuda_only", mutates_args=(), device_types="cuda")
def cuda_only(x: torch.Tensor) -> torch.Tensor:
    return x.clone()
"""


def test_a_custom_op_with_no_cpu_kernel_is_not_said_to_reproduce_on_the_cpu(tmp_path: Path) -> None:
    """A custom op registered for CUDA only cannot run on the CPU at all: the dispatcher's
    "Could not run ... from the 'CPU' backend" is no reproduction (the H200's extension op read
    "CPU: reproduces too (NotImplementedError: ...)"). Once the CPU check beside the shrink has
    said so, the smaller cases of the same op are not checked on the CPU again."""
    from reprocut.pipeline.cpu_check import no_cpu_kernel
    from reprocut.shrink.header import Header, header_text

    def case(rows: int) -> ReproCase:
        spec = TensorSpec((rows, 2), device="meta", values=Generated("randn"))
        return ReproCase("torch.ops.demo.cuda_only.default", (spec,), definitions=CUDA_ONLY)

    with Oracle(timeout=60) as oracle:
        answer = cpu_behaviour(case(8), {}, oracle)
        assert answer == (None, "torch.ops.demo.cuda_only.default has no CPU kernel")
        beside = CpuBeside({}, oracle)
        beside.submit(case(8))
        assert beside.answer_for(case(8)) == answer and beside.checks == 1
        beside.submit(case(4))
        assert beside.answer_for(case(4)) == answer and beside.checks == 1  # not asked again
        beside.close()
    assert not no_cpu_kernel("index out of range in self")
    assert no_cpu_kernel("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)")
    head = header_text(case(4), Header(cpu_reproduces=None, cpu_message=answer[1]))
    assert "CPU: not checked (torch.ops.demo.cuda_only.default has no CPU kernel)" in head
