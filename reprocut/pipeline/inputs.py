"""The captured tensors of a recording, as the shrink reads them (inputs.pt)."""

from __future__ import annotations

from typing import Any

from reprocut.model.case import Captured
from reprocut.model.errors import CorruptRecordingError
from reprocut.model.recording import Failure, RunDir


def load_inputs(run: RunDir, failure: Failure | None = None) -> dict[str, Any]:
    """The captured tensors; a recording whose cases need some that are not there is corrupt."""
    needed = sorted(_captured_keys(failure)) if failure is not None else []
    if not run.inputs_path.exists():
        if needed:
            raise CorruptRecordingError(
                f"{run.inputs_path} is missing: the recorded call's captured inputs are gone",
                hint="record the script again with `reprocut record`",
            )
        return {}
    import torch

    try:
        data = torch.load(run.inputs_path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptRecordingError(
            f"{run.inputs_path} cannot be read: {exc}",
            hint="record the script again with `reprocut record`",
        ) from exc
    if not isinstance(data, dict):
        raise CorruptRecordingError(f"{run.inputs_path} does not hold a dict of tensors")
    missing = [key for key in needed if key not in data]
    if missing:
        raise CorruptRecordingError(
            f"{run.inputs_path} lacks captured tensors the recording needs: {', '.join(missing)}",
            hint="record the script again with `reprocut record`",
        )
    return data


def _captured_keys(failure: Failure) -> set[str]:
    return {
        spec.values.key
        for case in failure.cases
        for _, spec in case.tensors()
        if isinstance(spec.values, Captured)
    }
