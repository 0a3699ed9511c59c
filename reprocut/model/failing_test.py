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


def placed_by_rerun(first: FailingTest | None, rerun: dict[str, Any] | None) -> FailingTest | None:
    """The first run's failing test, at the line the localizing rerun met the error in. An
    asynchronous CUDA error is met where the test's teardown waits for the GPU (the line of its
    `def`); the blocking rerun raises in the test's own line that led to the kernel."""
    again = FailingTest.from_json(rerun)
    if first is None or again is None or again.nodeid != first.nodeid or again.line == first.line:
        return first
    return replace(first, line=again.line, phase=again.phase)
