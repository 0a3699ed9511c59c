"""A recorded failure outside the dispatcher (or --source) ▶ the user's script, reduced.

Custom kernels leave no aten call to shrink: the source stage cuts the script itself down to
the failing launch, with the tensors that reached it (reprocut.source.recorded).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from reprocut.check.oracle import Oracle
from reprocut.model.errors import NotReproducedError, ReprocutError
from reprocut.model.recording import Failure
from reprocut.pipeline.cases import Outcome


class SourceReducerMissingError(ReprocutError):
    slug = "no-source-reducer"


def shrink_source(
    failure: Failure,
    oracle: Oracle,
    *,
    max_checks: int,
    max_time: float | None,
    on_event: Callable[[Any], None],
    kept: Path | None = None,
    traceback: str = "",
) -> Outcome:
    """Custom kernels and --source: reduce the user's script (reprocut.source.recorded)."""
    try:
        from reprocut.source.recorded import pin_script_dir, reduce_recorded
    except ImportError as exc:
        raise SourceReducerMissingError(
            "source-level reduction is not available in this installation",
            hint="reprocut.source.reducer is missing; shrink without --source",
        ) from exc
    if not failure.script:
        raise NotReproducedError(
            "the recording does not name the original script",
            hint="record it again with `reprocut record your_script.py`",
        )
    # reduce_recorded finds the failing call in the script or its sibling modules and probes
    # the tensors reaching it, so they can stand in for the model and data pipeline.
    result = reduce_recorded(
        failure,
        oracle=oracle,
        max_checks=max_checks,
        max_time=max_time,
        on_event=on_event,
        kept=kept,  # record's launch probe: two runs of the script fewer
        traceback=traceback,  # record's traceback: one run fewer
    )
    return Outcome(
        code=pin_script_dir(result.code, Path(failure.script).resolve().parent),
        statements=result.statements,
        tensor_elements=None,
        checks=result.checks,
        sidecar=False,
        passes=tuple((name, count) for name, count in result.accepted if count),
        from_script=True,
        stopped=result.stopped,
        slots=result.parallel,
    )
