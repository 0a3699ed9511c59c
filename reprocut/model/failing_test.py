"""The pytest test a failure happened in (`reprocut record -- pytest ...`): a test has no
training step, so the test names where the failure is."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class FailingTest:
    """The first test that failed in a torch op or with a CUDA error."""

    nodeid: str  # tests/test_x.py::test_name[param]
    file: str  # the test's file, absolute
    line: int  # the test's own line the error passed through
    phase: str = "call"  # pytest's: "setup" (a fixture), "call" or "teardown"
    exit_code: int | None = None  # pytest's exit code

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> FailingTest | None:
        if not data:
            return None
        return cls(
            nodeid=str(data["nodeid"]),
            file=str(data.get("file", "")),
            line=int(data.get("line", 0)),
            phase=str(data.get("phase", "call")),
            exit_code=data.get("exit_code"),
        )


def placed(
    first: FailingTest | None, rerun: dict[str, Any] | None, culprit_line: int | None = None
) -> FailingTest | None:
    """The first run's failing test, at the test's own line that led to the failing op. An
    asynchronous CUDA error is met where the test's teardown waits for the GPU, past the test's
    lines (the first run has only its `def`): the op's record keeps the line it ran from
    (`culprit_line`), and a blocking rerun raises in it (`rerun`: that run's test)."""
    if first is None:
        return None
    again = FailingTest.from_json(rerun)
    if again is not None and again.nodeid == first.nodeid and again.line != first.line:
        first = replace(first, line=again.line, phase=again.phase)
    if culprit_line and culprit_line != first.line:
        first = replace(first, line=culprit_line)
    return first
