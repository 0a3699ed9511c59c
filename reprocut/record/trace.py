"""trace.jsonl: one JSON line per completed step, flushed as it completes.

A training loop repeats itself, so a step whose ops equal an earlier step's is written as a
back-reference (`same_as`); a crash loses at most the step in flight. A light step (GPU runs,
see Recorder.wants_every_op) lists only its asserting ops and is marked `"every_op": false`.
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

    def write_step(self, step: int, ops: list[tuple[Any, ...]], *, every_op: bool = True) -> None:
        key = hash((every_op, tuple(ops)))
        first = self._seen.get(key)
        if first is not None:
            record: dict[str, Any] = {"type": "step", "step": step, "same_as": first}
        else:
            self._seen[key] = step
            record = {"type": "step", "step": step, "ops": _jsonable(ops)}
        if not every_op:
            record["every_op"] = False
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
