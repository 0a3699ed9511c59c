"""The captured tensors a check's script loads, in the folder it runs from (`SIDECAR_NAME`).

Checks side by side run from folders of their own, each needing the same captured tensors:
written once, then linked from the other folders (not gigabytes written again), and not written
again while the folder holds them already.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprocut.shrink.emitter import SIDECAR_NAME


class Sidecars:
    """What each check folder's sidecar holds: (keys, the inputs mapping's id)."""

    def __init__(self) -> None:
        self._held: dict[Path, tuple[tuple[str, ...], int]] = {}

    def link(self, folder: Path, sidecar_file: Path) -> None:
        """A file of captured tensors (the recording's) as `folder`'s sidecar, as it is."""
        link = folder / SIDECAR_NAME
        link.unlink(missing_ok=True)
        link.symlink_to(sidecar_file.resolve())
        self._held.pop(folder, None)

    def write(self, keys: tuple[str, ...], inputs: Mapping[str, Any], folder: Path) -> None:
        """`inputs[key]` for each of `keys` in `folder`'s sidecar (linked from another folder
        that has them)."""
        if self._held.get(folder) == (keys, id(inputs)):
            return
        held = list(self._held.items())  # other slots' checks may add theirs meanwhile
        written = next((f for f, k in held if k == (keys, id(inputs)) and f != folder), None)
        if written is not None and (written / SIDECAR_NAME).is_file():  # another slot's folder
            path = folder / SIDECAR_NAME  # has it: a link, not gigabytes written once more
            path.unlink(missing_ok=True)
            path.symlink_to((written / SIDECAR_NAME).resolve())
            self._held[folder] = (keys, id(inputs))
            return
        import torch

        missing = [key for key in keys if key not in inputs]
        if missing:
            raise KeyError(f"captured tensors missing from the inputs file: {missing}")
        path = folder / SIDECAR_NAME
        path.unlink(missing_ok=True)  # a link to a recording's file is replaced, not written to
        torch.save({key: inputs[key].detach().cpu() for key in keys}, path)
        self._held[folder] = (keys, id(inputs))
