"""Does the shrunk call fail on the CPU too? Asked beside the shrink, of each accepted case.

The answer goes into repro.py's header, so it is needed before the verification; asked after
the shrink it is one more check on the way there (0.36 s on an H200). `CpuBeside` asks it on a
thread of its own for the latest accepted case while the shrink goes on: one check at a time, a
newer case cancelling the one in flight, so the last accepted case, the shrink's result, is
usually answered by the time the shrink ends. Its checks run in a folder of their own (the
shrinker's checks write repro.py and the sidecar in the oracle's) and in children forked for
them, leaving the CUDA-ready standby child to the shrinker's next check.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from reprocut.check.connection import Ticket
from reprocut.check.oracle import Oracle, OtherFailure, Passed, Reproduced
from reprocut.model.case import ReproCase

CpuAnswer = tuple[bool | None, str]  # fails on the CPU too (None: not known), and how
NO_CPU_KERNEL = "has no CPU kernel"


def on_cpu(case: ReproCase) -> ReproCase:
    for path, spec in list(case.tensors()):
        if spec.device != "cpu":
            case = case.with_arg(path, replace(spec, device="cpu"))
    return case


def all_on_cpu(case: ReproCase) -> bool:
    return all(spec.device == "cpu" for _, spec in case.tensors())


def cpu_behaviour(
    case: ReproCase,
    inputs: dict[str, Any],
    oracle: Oracle,
    *,
    folder: Path | None = None,
    ticket: Ticket | None = None,
) -> CpuAnswer:
    """Does the same call fail on the CPU too, and with which message? `folder` and `ticket`:
    for a check beside the shrinker's (see CpuBeside)."""
    if all_on_cpu(case):
        return True, ""
    verdict = oracle.check_case(
        on_cpu(case),
        inputs,
        expected=None,
        workdir=folder,
        ticket=ticket,
        leave_standby=folder is not None,
    )
    if isinstance(verdict, OtherFailure) and no_cpu_kernel(verdict.message):  # not a bug's word
        return None, f"{case.target} {NO_CPU_KERNEL}"
    if isinstance(verdict, (OtherFailure, Reproduced)):
        return True, f"{verdict.signature.error_type}: {verdict.message.strip().splitlines()[0]}"
    if isinstance(verdict, Passed):
        return False, "runs without error"
    return None, type(verdict).__name__


# the dispatcher's word for an op registered for CUDA only, and Triton's for a CPU tensor
_NO_CPU_KERNEL = (
    ("Could not run '", "from the 'CPU' backend"),
    ("cannot be accessed from Triton", "cpu tensor"),
)


def no_cpu_kernel(message: str) -> bool:
    """The call cannot run on the CPU at all (a custom op with CUDA kernels only, a Triton
    kernel given CPU tensors), which says nothing of the bug: the H200's extension op and
    triton_op repros read "CPU: reproduces too (NotImplementedError: Could not run ...)"."""
    return any(all(part in message for part in parts) for parts in _NO_CPU_KERNEL)


class CpuBeside:
    """`cpu_behaviour` of the latest case `submit`ted, on a thread; `answer_for` the final one."""

    def __init__(self, inputs: dict[str, Any], oracle: Oracle) -> None:
        self.inputs = inputs
        self.oracle = oracle
        self.folder = oracle.workdir / "cpu-beside"
        self.folder.mkdir(exist_ok=True)
        self.checks = 0  # CPU checks started (superseded ones included)
        self._changed = threading.Condition()
        self._waiting: ReproCase | None = None
        self._running: tuple[ReproCase, Ticket] | None = None
        self._answer: tuple[ReproCase, CpuAnswer] | None = None
        self._busy = False  # the worker thread is running
        # targets a CPU check found no CPU kernel for: no smaller case of them will have one
        self._no_kernel: dict[str, CpuAnswer] = {}

    def submit(self, case: ReproCase) -> None:
        """Ask about `case` next, instead of any case asked about before."""
        with self._changed:
            if case.target in self._no_kernel:
                return
            running = self._running[0] if self._running else None
            answered = self._answer[0] if self._answer else None
            if case in (self._waiting, running, answered):
                return
            self._waiting = case
            if self._running is not None:
                self._running[1].cancel()
            if not self._busy:
                self._busy = True
                threading.Thread(target=self._work, name="reprocut-cpu-check", daemon=True).start()

    def answer_for(self, case: ReproCase) -> CpuAnswer | None:
        """The answer for `case` (waiting for its check if it is in flight); None when it was
        never asked about, or its check was cancelled or failed."""
        with self._changed:
            if self._waiting is not None and self._waiting != case:
                self._waiting = None
            if self._running is not None and self._running[0] != case:
                self._running[1].cancel()
            while self._busy:
                self._changed.wait()
            if case.target in self._no_kernel:
                return self._no_kernel[case.target]
            if self._answer is not None and self._answer[0] == case:
                return self._answer[1]
        return None

    def close(self) -> None:
        """Stop asking (an interrupted shrink); a check in flight is cancelled, not waited for."""
        with self._changed:
            self._waiting = None
            if self._running is not None:
                self._running[1].cancel()

    def _work(self) -> None:
        while True:
            with self._changed:
                case, self._waiting = self._waiting, None
                if case is None:
                    self._busy = False
                    self._changed.notify_all()
                    return
                ticket = Ticket()
                self._running = (case, ticket)
                self.checks += 1
            answer: CpuAnswer | None = None
            with contextlib.suppress(Exception):  # asked again after the shrink: its error shows
                answer = cpu_behaviour(
                    case, self.inputs, self.oracle, folder=self.folder, ticket=ticket
                )
            with self._changed:
                self._running = None
                if answer is not None and not ticket.cancelled:  # cancelled: superseded
                    self._answer = (case, answer)
                    if answer[0] is None and answer[1].endswith(NO_CPU_KERNEL):
                        self._no_kernel[case.target] = answer
