"""The oracle and a plain `python repro.py` must agree on every candidate the shrinker accepts.

Most of that is the oracle's own doing (no blocking launches, no per-op synchronization in its
children). What is left is the fork itself: a child shares the server's memory and modules, and
a candidate that moved a tensor between devices, changed its layout or handed a raw pointer to a
kernel can fail there and not in a fresh process (CuPy kernels given CPU tensors' `data_ptr()`
did on the H200). So `PlainAgreement` confirms a Reproduced verdict with a plain run whenever
the candidate's process-sensitive parts (devices, layouts, pointers, environment) differ from
the last candidate a plain run confirmed, and turns a disagreement into `ForkOnly`, which no
predicate accepts. The first candidate is always confirmed. Runs are bounded (`max_runs`, and
`max_seconds` of plain runs in all: on the H200 seven runs of a custom-kernel candidate took
half of a 60 s reduction); beyond that the final verification and the walk-back
(`reprocut.shrink.walkback`) decide.

A captured call of aten ops alone (`captured=True`, no custom op, no raw pointer) is cheaper to
trust: a shrink only removes from it, and removing a tensor or a view from an aten call cannot
make it fail in a fork alone, so only a process-sensitive word that appears or grows asks for a
plain run. Every captured call's first plain run (the recorded call itself) goes beside the
shrink instead of before it (`settle` gives its answer): on the H200 the plain runs of a
single-op device assert took 6 of its 16 s, a triton_op's first one 8.4 s of a 26 s first
check; a later candidate that needs a plain run waits for it.

`reproducing_form` settles the one case where blocking launches are truly needed: a CUDA case
that reproduces only with CUDA_LAUNCH_BLOCKING=1 gets it in its `env`, which the emitter writes
at the top of repro.py, so the oracle's children and the user's plain run both have it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from reprocut.check import check_log
from reprocut.check.oracle import ForkOnly, Oracle, Reproduced, Verdict
from reprocut.check.plainrun import PlainRunner
from reprocut.check.process_sensitive import Fingerprint, aten_only, fingerprint, grew
from reprocut.check.verify import RunOutcome
from reprocut.model.case import ReproCase, Signature
from reprocut.model.oom import cpu_allocator_refused, is_out_of_memory
from reprocut.model.signature import is_cuda_failure, is_memory_error, landed_elsewhere

BLOCKING = (("CUDA_LAUNCH_BLOCKING", "1"),)


def _contended(outcome: RunOutcome) -> bool:
    """A plain run that ran out of GPU memory: beside the reduction's checks (and other
    shrinks'), whose tensors share the GPU, that says nothing of the candidate. (On the H200,
    four shrinks at once, one plain run's disagreement, its cause not logged then, rolled a
    CuPy shrink back to the whole script: 371 checks and 217 s where it took 46 and 63 s.)"""
    error_type = "" if outcome.signature is None else outcome.signature.error_type
    tail = outcome.stderr_tail
    return is_out_of_memory(error_type, tail) and not cpu_allocator_refused(tail)


def _another_fault(outcome: RunOutcome, expected: Signature) -> bool:
    """A memory fault's plain run that raised another CUDA error: run once more before it
    refuses. Which error a fault raises can differ from run to run (at 44c17e5 on the H200 the
    second plain run of cuda_cupy_host_pointers' cut to its failing call raised the original's
    illegal address where the first had not; refused at 237d005, the cut took the reduction to the
    whole script: 160 s instead of 62). A run that passes, or raises no CUDA error, is believed
    at once: that is how a candidate that fails only in a fork shows (a custom op it cannot
    find). The invalid address space error agrees as it is (`landed_elsewhere`)."""
    seen = outcome.signature
    if seen is None or seen.matches(expected, compare_op=False) or not is_memory_error(expected):
        return False
    if landed_elsewhere(seen, expected):
        return False
    return is_cuda_failure(seen.error_type, seen.kind, seen.error_code)


def _seen(outcome: RunOutcome) -> str | None:
    return None if outcome.signature is None else outcome.signature.describe()


class PlainAgreement:
    """An Oracle `confirm` hook: plain runs for the candidates a fork may judge differently."""

    def __init__(
        self,
        runner: PlainRunner | None = None,
        *,
        max_runs: int = 8,
        max_seconds: float | None = None,
        timeout: float = 120.0,
        finish: Callable[[str], str] | None = None,
        captured: bool = False,
        beside: bool = False,
    ) -> None:
        """`captured`: the candidates are reprocut's emitted captured calls, which a shrink
        only makes smaller (not a user's script reduced). `beside`: a script's plain runs go
        beside its reduction, one at a time; one that disagrees is handed to the reducer
        (`refused`), which takes the script back to before that candidate."""
        self.runner = runner or PlainRunner()
        self.captured = captured
        # what a candidate becomes as repro.py (a script reduction's ends by waiting for the
        # GPU, as the fork child does after every candidate): the plain run runs that
        self.finish = finish
        self.max_runs = max_runs
        self.max_seconds = max_seconds
        self.timeout = timeout
        self.confirmed: tuple[tuple[str, int], ...] | None = None
        self.trusted: tuple[tuple[str, int], ...] | None = None  # the user's script's, for good
        self.runs = 0
        self.disagreements = 0
        self.seconds = 0.0
        self._pending: Future[Verdict] | None = None  # the first run, beside the shrink
        self._refused: ForkOnly | None = None  # what that run said, if it disagreed
        self.beside = beside
        # a script candidate's run beside the reduction: (its code, the fingerprint confirmed
        # before it, the run); and the candidates such runs refused, not yet handed over
        self._script_run: tuple[str, Fingerprint | None, Future[Verdict]] | None = None
        self._late: list[str] = []

    def trust(self, code: str) -> None:
        """`code` is known to fail this way in a plain run (the user's own script, which did):
        candidates that leave its process-sensitive parts alone need no plain run, and the
        script itself never does (on the H200 its check, settled after a candidate's had moved
        `confirmed` on, ran the whole training script plainly for 11.8 s, which the next
        candidate then waited for)."""
        self.confirmed = self.trusted = fingerprint(code)

    def warm_up(self) -> None:
        """Start the first plain interpreter while the fork server starts."""
        self.runner.warm_up()

    def __call__(
        self,
        code: str,
        filename: str,
        cwd: str,
        argv: list[str],
        verdict: Verdict,
        expected: Signature | None,
    ) -> Verdict:
        if not isinstance(verdict, Reproduced) or expected is None:
            return verdict
        mark = fingerprint(code)
        trusted = self.captured and aten_only(code)
        if self._refused is not None:  # the first candidate fails in a fork alone: so do these
            return replace(self._refused, seconds=verdict.seconds)
        if mark in (self.confirmed, self.trusted) or self.runs >= self.max_runs:
            return verdict
        if trusted and self.confirmed is not None and not grew(mark, self.confirmed):
            return verdict
        if self.spent():
            return verdict
        if self.captured and self.confirmed is None and self._pending is None:
            self.confirmed = mark  # for now: `settle` says whether the plain run agreed
            self._pending = self._beside(code, Path(filename), cwd, argv, verdict, expected)
            return verdict
        refused = self.settle()  # one plain run at a time
        if refused is not None:  # the first candidate, beside until now, failed in a fork alone
            return replace(refused, seconds=verdict.seconds)
        script = Path(filename)
        if self.beside:
            return self._script_beside(code, script, cwd, argv, verdict, expected, mark)
        return self._confirm(code, script, Path(cwd), argv, verdict, expected, mark)

    def _script_beside(
        self,
        code: str,
        script: Path,
        cwd: str,
        argv: list[str],
        verdict: Verdict,
        expected: Signature,
        mark: Fingerprint,
    ) -> Verdict:
        """Accept the candidate now and run it plainly beside the reduction (on the H200 a
        CuPy script's blocking plain runs took 5-8 s of its reduction's critical path, each
        agreeing). The run before it is settled first: if it disagreed, this candidate, made
        from that one, is refused too."""
        late = self._settle_script()
        if late is not None:
            return replace(late, seconds=verdict.seconds)
        if mark in (self.confirmed, self.trusted) or self.spent():
            return verdict
        # a file of its own beside the script (its siblings import as they do for the script;
        # the oracle rewrites the candidate's file for the next check meanwhile)
        own = script.with_name(f".reprocut-plain-{script.name.removeprefix('.reprocut-')}")

        def run() -> Verdict:
            try:
                return self._confirm(code, own, Path(cwd), argv, verdict, expected, mark)
            finally:
                own.unlink(missing_ok=True)

        self._script_run = (code, self.confirmed, _on_a_thread(run))
        self.confirmed = mark  # for now: later candidates like it need no run of their own
        return verdict

    def _settle_script(self) -> ForkOnly | None:
        """Wait for the script run beside the reduction, if any: its verdict when it
        disagreed (its candidate then goes to `refused`), else None."""
        if self._script_run is None:
            return None
        code, before, future = self._script_run
        self._script_run = None
        seen = future.result()
        if not isinstance(seen, ForkOnly):
            return None
        self.confirmed = before
        self._late.append(code)
        return seen

    def refused(self, wait: bool = False) -> str | None:
        """A candidate the reducer accepted that its plain run, beside the reduction since,
        did not reproduce: the reducer goes back to before it. `wait`: settle the run still
        going first (at the end of a round)."""
        if wait or (self._script_run is not None and self._script_run[2].done()):
            self._settle_script()
        return self._late.pop(0) if self._late else None

    def spent(self) -> bool:
        """No more plain runs: one more, as long as the mean run so far, would take them past
        `max_seconds` (the first run is always made: the biggest change comes first). On the
        H200, with four shrinks at once, a CuPy case's three plain runs took 27 s of a 6 s
        bound, the last one started with the bound nearly spent."""
        if self.max_seconds is None or not self.runs:
            return False
        return self.seconds + self.seconds / self.runs > self.max_seconds

    def _confirm(
        self,
        code: str,
        script: Path,
        cwd: Path,
        argv: list[str],
        verdict: Verdict,
        expected: Signature,
        mark: Fingerprint,
    ) -> Verdict:
        written = self.finish(code) if self.finish is not None else code
        if not script.exists() or script.read_text() != written:
            script.write_text(written)
        for attempt in range(2):  # again if the GPU's memory was others', or for another error
            outcome = self.runner.run(script, argv=argv, cwd=cwd, timeout=self.timeout)
            self.runs += 1
            self.seconds += outcome.seconds
            if attempt or not (_contended(outcome) or _another_fault(outcome, expected)):
                break
            check_log.log("plain", seconds=round(outcome.seconds, 3), script=script.name,
                          agreed=False, seen=_seen(outcome), returncode=outcome.returncode,
                          again=True)  # fmt: skip
        seen = outcome.signature
        related = landed_elsewhere(seen, expected)
        agreed = seen is not None and (related or seen.matches(expected, compare_op=False))
        check_log.log("plain", seconds=round(outcome.seconds, 3), script=script.name,
                      agreed=agreed, seen=_seen(outcome), returncode=outcome.returncode,
                      **({"related": True} if related else {}))  # fmt: skip
        if agreed:
            self.confirmed = mark
            return verdict
        self.disagreements += 1
        return ForkOnly(verdict.signature, seen, outcome.stderr_tail, verdict.seconds)

    def _beside(
        self,
        code: str,
        script: Path,
        cwd: str,
        argv: list[str],
        verdict: Verdict,
        expected: Signature,
    ) -> Future[Verdict]:
        """The plain run of this candidate on a thread, from a folder of its own (the oracle
        rewrites its script and sidecar for the next candidate meanwhile)."""
        folder = Path(tempfile.mkdtemp(prefix="reprocut-first-"))
        for sidecar in script.parent.glob("*.pt"):
            _keep(sidecar, folder / sidecar.name)
        own = folder / script.name
        own_cwd = folder if Path(cwd).resolve() == script.parent.resolve() else Path(cwd)
        mark = self.confirmed or ()

        def run() -> Verdict:
            try:
                return self._confirm(code, own, own_cwd, argv, verdict, expected, mark)
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        return _on_a_thread(run)

    def settle(self) -> ForkOnly | None:
        """Wait for the first candidate's plain run if it went beside the shrink: None when it
        agreed (or none went), else its verdict, which every later candidate shares."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            seen = pending.result()
            if isinstance(seen, ForkOnly):
                self._refused = seen
                self.confirmed = None
        return self._refused

    def start_scripts(self) -> None:
        """The captured call did not reproduce: the user's script is reduced next, whose
        candidates get every plain run a script's do."""
        self.settle()
        self.captured = False
        self.confirmed = None
        self._refused = None

    def to_json(self) -> dict[str, Any]:
        return {
            "plain_runs": self.runs,
            "disagreements": self.disagreements,
            "seconds": round(self.seconds, 3),
        }

    def close(self) -> None:
        self.runner.close()  # a first run still beside the shrink ends within its timeout

    def __enter__(self) -> PlainAgreement:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _on_a_thread(run: Callable[[], Verdict]) -> Future[Verdict]:
    """`run` on a plain-run thread of its own, not waited for here (its Future is)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reprocut-plain")
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


def _keep(sidecar: Path, to: Path) -> None:
    """`sidecar` as it is now, at `to`: a hard link (the oracle replaces its own file for the
    next candidate, a new file, so the link keeps this one's values; gigabytes of captured
    tensors are not copied), a copy where the file system allows no link."""
    try:
        os.link(sidecar.resolve(), to)
    except OSError:
        shutil.copyfile(sidecar, to)


def reproducing_form(
    oracle: Oracle, case: ReproCase, inputs: Mapping[str, Any], expected: Signature | None
) -> tuple[ReproCase, Verdict]:
    """`case` as it reproduces: as it is, or, for a CUDA case that reproduces only with blocking
    launches, with CUDA_LAUNCH_BLOCKING=1 in its env (then the repro sets it too)."""
    verdict = oracle.check_case(case, inputs, expected=expected)
    on_cuda = any(spec.device.startswith("cuda") for _, spec in case.tensors())
    if isinstance(verdict, Reproduced) or case.env or not on_cuda:
        return case, verdict
    blocking = replace(case, env=BLOCKING)
    second = oracle.check_case(blocking, inputs, expected=expected)
    if isinstance(second, Reproduced):
        return blocking, second
    return case, verdict
