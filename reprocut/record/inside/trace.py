"""trace.jsonl: one JSON line per completed step, flushed as it completes.

A training loop repeats itself, so a step whose ops equal an earlier step's is written as a
back-reference (`same_as`); a crash loses at most the step in flight. A light step (GPU runs,
see Recorder.wants_every_op) lists only its asserting ops and is marked `"every_op": false`.
On a GPU each step also says the last step whose kernels were known complete when it ended
(`healthy_through`): a process that dies without reporting leaves that much on disk, and a
rerun to localize its fault starts after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

import torch


class TraceWriter:
    """Appends completed steps to trace.jsonl; repeated steps become back-references."""

    def __init__(self, path: Path) -> None:
        self._file: TextIO = path.open("a", buffering=1 << 16)
        self._seen: dict[int, int] = {}

    def write_step(
        self,
        step: int,
        ops: list[tuple[Any, ...]],
        *,
        every_op: bool = True,
        healthy_through: int = -1,
    ) -> None:
        key = hash((every_op, tuple(ops)))
        first = self._seen.get(key)
        if first is not None:
            record: dict[str, Any] = {"type": "step", "step": step, "same_as": first}
        else:
            self._seen[key] = step
            record = {"type": "step", "step": step, "ops": _jsonable(ops)}
        if not every_op:
            record["every_op"] = False
        if healthy_through >= 0:
            record["healthy_through"] = healthy_through
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.flush()
        self._file.close()


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return value.type
    if isinstance(value, (tuple, list)):
        return [_jsonable(item) for item in value]
    return value
