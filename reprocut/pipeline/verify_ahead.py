"""repro.py's verification started before the reduction ends: the plain runs, and for a memory
fault on the GPU the memcheck, of the best repro so far once no better one has come for `SETTLE`
seconds after the reduction's first round (`FIRST_ROUND_SETTLE` seconds in it).

Why: on the H200 (69c0cb6, four shrinks at once) the verification took 7-16 s after each
reduction (three plain runs, 1.4-9 s, then the repro's memcheck, ending 2.4-8 s after them),
while the reduction's last 2-20 s accepted nothing: its best then was already the repro. So
that best is run the way repro.py will be, in a folder of its own (`ahead/N/repro.py` beside
repro.py): its memcheck first, its plain runs a little later (`PLAIN_LATER`) in the
verification's interpreters started ahead (reprocut.pipeline.ahead). A newer best stops it and
takes its place once it has stood as long; the interpreters it used are started again.

The answer is used only for the very code repro.py ends with, its module docstring aside (the
header is edited after the verification anyway: memcheck's findings and the repro's own
message go into it). Else the verification runs afresh on repro.py, as without any of this.
"""

from __future__ import annotations

import ast
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from reprocut.check import check_log
from reprocut.check.plainrun import Standbys
from reprocut.check.sanitizer import LOG_NAME, Evidence, find_sanitizer, run_memcheck
from reprocut.check.verify import DEVICE_BUSY, Verification, verify
from reprocut.model.case import ReproCase, Signature
from reprocut.model.errors import ExitCode
from reprocut.model.signature import is_memory_error
from reprocut.pipeline.daemon import in_daemon_thread
from reprocut.source.results import SourceAccepted, SourceRound

# seconds a best must stand before its verification starts. On the H200 (f56cbf0, four shrinks
# at once, no wait for the first round) 2 s started 1-18 a shrink, 60 of 91 in the first round,
# all but the last stopped by a newer best, and every check was slower (median 1.0-1.7 s
# against 0.9-1.5 s); 5 s (126c0d1) did not make the shrinks faster either. After the first
# round (69c0cb6's check logs) a best stood over 2 s 0-6 times a shrink, the last one 2-20 s.
SETTLE = 2.0
# seconds a best must stand in the reduction's first round (`after_a_round`). An op-level
# shrink's first round ends with long runs of sizes that no longer fail: on the H200 (44c17e5)
# cuda_triton_op_compiled's last best stood 20 s in it, its verification waiting for the round's
# end and then taking 14 s after the reduction. In ten shrinks' check logs a stand of 10 s in the
# first round came 4 times besides (three in script reductions, each then replaced).
FIRST_ROUND_SETTLE = 10.0
# seconds after its memcheck that a speculation's plain runs start, if its best still stands:
# they took 1.4-9 s where its memcheck took 7-16 s, so they end before it all the same, and a
# best replaced meanwhile has cost one process, not four
PLAIN_LATER = 3.0
FOLDER = "ahead"

Render = Callable[[Any], "str | None"]  # a best (script text or case) -> repro.py's text


def code_of(text: str) -> str:
    """The text without its module docstring: what runs (the header is not)."""
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError):
        return text
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
    ):
        return "".join(text.splitlines(keepends=True)[first.end_lineno :]).lstrip("\n")
    return text


@dataclass
class Speculation:
    """One verification started ahead: its script (and the code it runs, `code_of` its text),
    its plain runs and memcheck (None: not run ahead), and what stops them."""

    index: int
    script: Path
    code: str
    verification: Future[Verification] | None
    memcheck: Future[Evidence] | None
    cancel: threading.Event = field(default_factory=threading.Event)
    interpreters: list[Any] = field(default_factory=list)

    def stop(self) -> None:
        self.cancel.set()
        for interpreter in self.interpreters:  # their runs end now, their answers unused
            interpreter.discard()

    def memcheck_for(self, repro: Path) -> Future[Evidence] | None:
        """The memcheck's answer as repro.py's own: its log copied beside repro.py."""
        if self.memcheck is None:
            return None
        moved: Future[Evidence] = Future()

        def copy(done: Future[Evidence]) -> None:
            try:
                evidence = done.result()
            except BaseException as exc:
                moved.set_exception(exc)
                return
            if evidence.log and Path(evidence.log).is_file():
                saved = repro.with_name(LOG_NAME)
                shutil.copyfile(evidence.log, saved)
                evidence = replace(evidence, log=str(saved))
            moved.set_result(evidence)

        self.memcheck.add_done_callback(copy)
        return moved


class VerifyAhead:
    """Offered each new best (`offer`), verifies the one that has stood `settle` seconds;
    `take` hands over the speculation whose code is repro.py's, if there is one."""

    def __init__(
        self,
        out: Path,
        expected: Signature,
        *,
        runs: int,
        timeout: float,
        memcheck_timeout: float,
        standbys: Standbys | None,
        memcheck: bool,
        kernel: str | None = None,
        settle: float | None = None,
        after_a_round: bool = True,
        first_round_settle: float = FIRST_ROUND_SETTLE,
    ) -> None:
        """`out`: repro.py's folder; `standbys`: the verification's interpreters (the plain
        runs go ahead only in them: a fresh run would gain little and could not be stopped);
        `memcheck`: run memcheck too (a memory fault on the GPU), filtering `kernel`;
        `after_a_round`: until the reduction's first round has ended (`round_ended`), a best
        must stand `first_round_settle` seconds, not `settle`."""
        self.folder = out / FOLDER
        self.expected, self.runs = expected, runs
        self.timeout, self.memcheck_timeout = timeout, memcheck_timeout
        self.standbys, self.memcheck, self.kernel = standbys, memcheck, kernel
        self.settle = SETTLE if settle is None else settle
        self._lock = threading.Condition()
        self._offered: tuple[Any, Render, float] | None = None
        self._plain_at: float | None = None  # when the current speculation's plain runs start
        self._allowed = not after_a_round
        self.first_round_settle = first_round_settle
        self._current: Speculation | None = None
        self._count = 0
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop, name="reprocut-verify-ahead", daemon=True
        )
        self._thread.start()

    def offer(self, best: Any, render: Render) -> None:
        """A new best (rendered to repro.py's text only once it has stood `settle` seconds);
        the plain runs of the one before it, not started yet, will not be."""
        with self._lock:
            if self._closed:
                return
            self._offered = (best, render, time.monotonic())
            self._plain_at = None
            self._lock.notify_all()

    def round_ended(self) -> None:
        """A round of the reduction changed the best and another follows: bests may be
        verified ahead from now on. In the first round the best changes every few seconds and
        its candidates still make the script's full-size tensors: on the H200 at f56cbf0, 60
        of the 91 verifications ahead started in ten shrinks were in it (all but one of them
        stopped by a newer best), and the checks of every shrink beside them were slower."""
        with self._lock:
            self._allowed = True
            self._lock.notify_all()

    def take(self, repro_text: str) -> Speculation | None:
        """Stop offering; the speculation that ran repro.py's code (None: none did, and any
        still running is stopped)."""
        self._stop_thread()
        current, self._current = self._current, None
        if current is None:
            return None
        if current.code == code_of(repro_text):
            check_log.log("verify_ahead", event="used", index=current.index)
            return current
        current.stop()
        check_log.log("verify_ahead", event="missed", index=current.index)
        return None

    def close(self) -> None:
        """Stop whatever runs; remove the folder (a taken speculation's answers are read by
        then: its memcheck log is copied beside repro.py)."""
        self._stop_thread()
        if self._current is not None:
            self._current.stop()
            self._current = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def _stop_thread(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    now, offered, plain_at = time.monotonic(), self._offered, self._plain_at
                    settle = self.settle if self._allowed else self.first_round_settle
                    due = [] if offered is None else [offered[2] + settle]
                    due += [] if plain_at is None else [plain_at]
                    if offered is not None and offered[2] + settle <= now:
                        self._offered = None
                        break
                    if plain_at is not None and plain_at <= now:
                        self._plain_at = offered = None
                        break
                    self._lock.wait(min(due) - now if due else None)
            if offered is None:  # the plain runs of the speculation that still stands
                if self._current is not None:
                    self._start_plain(self._current)
                continue
            best, render, _ = offered
            try:
                text = render(best)
            except Exception:  # a best that does not render is not verified ahead
                text = None
            if text is not None:
                self._start(text)

    def _start(self, text: str) -> None:
        """Stop the running speculation, start one for `text`: its memcheck now and its plain
        runs `PLAIN_LATER` seconds later if no newer best has come by then (at once if there
        is no memcheck)."""
        if self._current is not None:
            if self._current.code == code_of(text):
                return  # the same code (a case whose header alone changed)
            self._current.stop()
            check_log.log("verify_ahead", event="stopped", index=self._current.index)
            if self._current.interpreters and self.standbys is not None:
                self.standbys.refill()
            self._current = None
        plain = self.standbys is not None and self.standbys.fit(text)
        memcheck = self.memcheck and "cuda" in text
        if not (plain or memcheck):
            return
        self._count += 1
        script = self.folder / str(self._count) / "repro.py"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
        speculation = self._current = Speculation(self._count, script, code_of(text), None, None)
        if memcheck:
            speculation.memcheck = in_daemon_thread(partial(
                run_memcheck, script, timeout=self.memcheck_timeout, kernel=self.kernel,
                cancel=speculation.cancel,
            ), name="reprocut-verify-ahead-run")  # fmt: skip
        check_log.log("verify_ahead", event="started", index=self._count, memcheck=memcheck)
        if plain and not memcheck:
            self._start_plain(speculation)
        elif plain:
            with self._lock:
                if self._offered is None:  # else a newer best is waiting its turn
                    self._plain_at = time.monotonic() + PLAIN_LATER

    def _start_plain(self, speculation: Speculation) -> None:
        """The speculation's plain runs, in the interpreters started ahead (all or none)."""
        assert self.standbys is not None
        interpreters = self.standbys.take()
        if len(interpreters) < self.runs:  # one went missing: not ahead
            for interpreter in interpreters:
                interpreter.discard()
            self.standbys.refill()
            return
        speculation.interpreters = interpreters
        speculation.verification = in_daemon_thread(partial(
            verify, speculation.script, self.expected, runs=self.runs, timeout=self.timeout,
            standbys=interpreters,
        ), name="reprocut-verify-ahead-run")  # fmt: skip
        check_log.log("verify_ahead", event="plain", index=speculation.index)


def usable(verification: Verification) -> bool:
    """Plain runs ahead that stand for repro.py's: every one failed as expected. Anything else
    (a flaky repro, a GPU busy with another process) is run again on repro.py itself, whose
    runs the walk-back and report.md then quote."""
    busy = any(DEVICE_BUSY in outcome.stderr_tail for outcome in verification.outcomes)
    return verification.exit_code == ExitCode.OK and not busy


def went_ahead_verification(speculation: Speculation | None) -> Verification | None:
    """The plain runs that went ahead, if they stand for repro.py's (`usable`)."""
    if speculation is None or speculation.verification is None:
        return None
    verification = speculation.verification.result()
    return verification if usable(verification) else None


def start_verify_ahead(
    out: Path,
    expected: Signature,
    device: str,
    *,
    runs: int,
    timeout: float,
    memcheck_timeout: float,
    standbys: Standbys | None,
    kernel: str | None,
) -> VerifyAhead | None:
    """A VerifyAhead where something can go ahead: the verification's interpreters were
    started (a machine with the cores for them), or memcheck will run (a memory fault on the
    GPU, compute-sanitizer installed)."""
    memcheck = is_memory_error(expected) and device.startswith("cuda") and bool(find_sanitizer())
    if standbys is None and not memcheck:
        return None
    return VerifyAhead(out, expected, runs=runs, timeout=timeout, memcheck_timeout=memcheck_timeout,
                       standbys=standbys, memcheck=memcheck, kernel=kernel)  # fmt: skip


def offering(
    on_event: Callable[[Any], None],
    ahead: VerifyAhead,
    *,
    finish_script: Callable[[str], str] | None,
    render_case: Callable[[Any], tuple[str, tuple[str, ...]]],
) -> Callable[[Any], None]:
    """`on_event` that also offers each new best: a script reduction's (SourceAccepted), made
    what its result is made (`finish_script`: a sync at the end, formatted, the script's folder
    pinned), and a captured call's (the shrinker's "accepted"), rendered as repro.py is unless
    it loads a sidecar of captured tensors (not copied ahead: not verified ahead)."""

    def case_text(case: Any) -> str | None:
        code, sidecar_keys = render_case(case)
        return None if sidecar_keys else code

    def offered(event: Any) -> None:
        on_event(event)
        if isinstance(event, SourceAccepted):
            if finish_script is not None:
                ahead.offer(event.code, finish_script)
        elif isinstance(event, SourceRound) or getattr(event, "kind", None) == "round":
            ahead.round_ended()
        elif getattr(event, "kind", None) == "accepted" and isinstance(
            getattr(event, "best", None), ReproCase
        ):
            ahead.offer(event.best, case_text)

    return offered
