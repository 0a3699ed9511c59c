"""A failure after the training loop had ended: it happened in no training step.

reprocut counts optimizer steps; after the last one its counter names a step that never ran
("training step 3000" for a `generate()` after a 3000-iteration loop). Record notes where the
loop is (record/inside/loops.py: TrainingLoop) and says so instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AfterLoop:
    steps: int  # optimizer steps that had run
    function: str | None = None  # the user's function it failed in (generate, evaluate)

    def describe(self) -> str:
        """`after the training loop (3000 steps ran), in generate()`."""
        where = f", in {self.function}()" if self.function else ""
        plural = "" if self.steps == 1 else "s"
        return f"after the training loop ({self.steps} step{plural} ran){where}"

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "function": self.function, "text": self.describe()}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> AfterLoop | None:
        if not data:
            return None
        return cls(int(data["steps"]), data.get("function"))

    @classmethod
    def from_outcome(cls, recorded: dict[str, Any] | None, step: int | None) -> AfterLoop | None:
        """From what the child recorded (a culprit's, snapshot's or outcome's `after_loop`), at
        reprocut's step counter `step`."""
        found = (recorded or {}).get("after_loop")
        if not isinstance(found, dict) or step is None:
            return None
        return cls(step, found.get("function"))
