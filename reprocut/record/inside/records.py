"""What the recorder keeps of the ops it saw: each step's snapshots, and the culprit.

The dispatch mode (ops.py), the tripwire's handler and the function mode (calls.py) make
Snapshots and the Culprit and keep them in the run's state (state.py); outcome.py writes them to
outcome.json as JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from reprocut.model.case import SourceLocation
from reprocut.record.inside.capture import HeldCall


@dataclass
class Snapshot:
    """An asserting op's call, with its evidence queued for copy to host before it ran.

    The calls are held, not JSON: most snapshots belong to healthy steps and are dropped unread.
    """

    seq: int
    op: str
    target: str
    call: HeldCall
    step: int
    phase: str
    module: str | None
    source: SourceLocation | None
    public_call: str | None
    public: HeldCall | None  # the enclosing public call's arguments, captured alike
    call_site: SourceLocation | None = None  # the line outside torch that called its API
    loop: dict[str, int] = field(default_factory=dict)  # the user's loop counters (loops.py)
    after_loop: dict[str, Any] | None = None  # ran after the training loop (loops.py)
    test_line: int | None = None  # under pytest: the test's own line that led to the op

    def captured_keys(self) -> Iterator[str]:
        """The store keys of its host copies."""
        yield from self.call.captured_keys()
        if self.public is not None:
            yield from self.public.captured_keys()

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "op": self.op,
            "target": self.target,
            "call": self.call.to_json(),
            "step": self.step,
            "phase": self.phase,
            "module": self.module,
            "source": None if self.source is None else self.source.to_json(),
            "public_call": self.public_call,
            "public": None if self.public is None else self.public.to_json(),
            "call_site": None if self.call_site is None else self.call_site.to_json(),
            "loop": self.loop,
            "after_loop": self.after_loop,
            "test_line": self.test_line,
        }


@dataclass
class Culprit:
    """The op (or public call) that raised, with its inputs as captured before it ran."""

    op: str | None
    target: str | None
    call: dict[str, Any] | None
    step: int
    phase: str
    module: str | None
    source: SourceLocation | None
    forward_source: SourceLocation | None
    public_call: str | None
    public: dict[str, Any] | None
    synchronized: bool  # raised with a sync before and after: certainly this op
    call_site: SourceLocation | None = None  # the line outside torch that called its API
    loop: dict[str, int] = field(default_factory=dict)  # the user's loop counters (loops.py)
    after_loop: dict[str, Any] | None = None  # ran after the training loop (loops.py)
    test_line: int | None = None  # under pytest: the test's own line that led to the op

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "target": self.target,
            "call": self.call,
            "step": self.step,
            "phase": self.phase,
            "module": self.module,
            "source": None if self.source is None else self.source.to_json(),
            "forward_source": None
            if self.forward_source is None
            else self.forward_source.to_json(),
            "public_call": self.public_call,
            "public": self.public,
            "synchronized": self.synchronized,
            "call_site": None if self.call_site is None else self.call_site.to_json(),
            "loop": self.loop,
            "after_loop": self.after_loop,
            "test_line": self.test_line,
        }
