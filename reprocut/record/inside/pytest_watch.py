"""pytest under the recorder: the first test that fails in a torch op or with a CUDA error.

`reprocut record -- pytest ARGS` (or `-- python -m pytest ARGS`) runs the real pytest in the
child, as its console script does, with one plugin of reprocut's. Every test runs as it would;
pytest prints what it prints and exits with its own code. The plugin watches each test: the
recorder notes the first op that raises as the culprit, so a culprit noted in a test that then
passes (`pytest.raises(IndexError)`) is forgotten when the next test starts. The first test
that fails with a culprit noted, or with a CUDA error, keeps its culprit (later tests cannot
replace it) and is named by its node id, its file and its own line (the test's line the error
passed through). When pytest ends, its error is handed to the child as `FailedTest`, so the
outcome is that test's failure, with pytest's exit code. On a GPU each test's end waits for
the GPU, so an asynchronous CUDA error is charged to the test that launched the kernel (pytest
shows it as an error at that test's teardown).
"""

from __future__ import annotations

import itertools
import linecache
import sys
from types import TracebackType
from typing import Any

import pytest
import torch

from reprocut.record.inside.frames import plain_python_frames
from reprocut.record.inside.pytest_failure import FailedTest
from reprocut.record.inside.specs import is_cuda_error
from reprocut.record.inside.state import RunState


class PytestWatch:
    """The pytest plugin: forgets culprits of passing tests, keeps the first failing test's."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.error: BaseException | None = None
        self.test: dict[str, Any] | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.test is None:
            function = getattr(item, "function", None)
            self.state.test_code = getattr(function, "__code__", None)  # its line, per op
            self.state.culprit = None  # noted in an earlier test that did not fail by it
            self.state.culprit_error = None
            self.state.light_culprit = None
            self.state.raise_missed = False  # a backward that raised in a passing test

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        """Wait for the GPU at each test's end, so an asynchronous CUDA error is met in the test
        that launched the kernel (as an error at its teardown), not in a later one."""
        if self.test is None and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        if call.excinfo is not None:  # pytest shows the traceback python would show
            _show_plain_traceback(call.excinfo)
        outcome = yield
        report = outcome.get_result()
        if self.test is not None or not report.failed or call.excinfo is None:
            return
        error = call.excinfo.value
        if self.state.culprit is None and not is_cuda_error(error):
            return  # failed for another reason: an assert, a fixture's own error
        self.error = error
        self.test = {
            "nodeid": item.nodeid,
            "file": str(item.path),
            "line": _test_line(item, error.__traceback__),
            "phase": call.when,
        }


def _show_plain_traceback(excinfo: Any) -> None:
    """Relink the error's traceback to the frames plain python shows: without reprocut's own and
    the torch frames its modes add. Relinked in place (tb_next), since pytest cuts tracebacks
    from their raw entries."""
    tbs: list[TracebackType] = []
    tb = excinfo.tb
    while tb is not None:
        tbs.append(tb)
        tb = tb.tb_next
    frames = [_Frame(tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb) for tb in tbs]
    kept = [frame.tb for frame in plain_python_frames(frames)]
    if len(kept) == len(tbs) or not kept or kept[0] is not tbs[0]:
        return
    for before, after in itertools.pairwise(kept):
        before.tb_next = after
    kept[-1].tb_next = None
    excinfo._traceback = None  # recomputed from the relinked entries


class _Frame:
    """A traceback entry as plain_python_frames reads frames."""

    def __init__(self, filename: str, lineno: int, tb: TracebackType) -> None:
        self.filename = filename
        self.lineno = lineno
        self.tb = tb
        self.line = linecache.getline(filename, lineno).strip()


def _test_line(item: pytest.Item, tb: TracebackType | None) -> int:
    """The test function's line the error passed through; else the line of its `def`."""
    function = getattr(item, "function", None)
    code = getattr(function, "__code__", None)
    found = None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            found = tb.tb_lineno
        tb = tb.tb_next
    if found is not None:
        return found
    location_line = item.location[1]
    return (location_line or 0) + 1


def run_pytest(state: RunState) -> None:
    """pytest as its console script runs it (arguments from sys.argv), watched."""
    watch = PytestWatch(state)
    try:
        code = int(pytest.main(plugins=[watch]))
    finally:
        sys.stdout.flush()
    if watch.test is not None and watch.error is not None:
        raise FailedTest(watch.error, {**watch.test, "exit_code": code}, code)
    raise SystemExit(code)
