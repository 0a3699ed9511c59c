"""A machine-wide bound on GPU checks in flight, shared by every shrink running on it.

Each check of a CUDA candidate starts a CUDA context in a fresh child, and the driver makes
contexts one after another: on the H200 a probe check took 0.65 s alone (0.24 s of it the
context) and 5.5 s with sixteen at once (3.25 s the context), fewer checks a second in all than
four at once gave. One shrink keeps at most four candidates in flight
(reprocut.source.speculation.MAX_SLOTS); four shrinks side by side would keep sixteen. So a
GPU check first takes one of a few lock files under the temp folder (`flock`: a crashed
process's lock goes with it), waiting while all are taken: the machine runs as many GPU checks
as suits it, however many shrinks share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

WAIT = 0.02  # seconds between tries while every slot is taken


ONE_SHRINK = 4  # the most one shrink keeps in flight (reprocut.source.speculation.MAX_SLOTS)


def machine_slots(cores: int | None = None) -> int:
    """GPU checks in flight on this machine: a quarter of its cores, at least one shrink's
    own, at most eight."""
    count = os.cpu_count() if cores is None else cores
    return max(ONE_SHRINK, min(8, (count or 1) // 4))


def slot_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"reprocut-gpu-slots-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


@contextlib.contextmanager
def gpu_slot(slots: int | None = None, folder: Path | None = None) -> Iterator[int]:
    """Hold one of the machine's GPU check slots while the block runs; yields its number."""
    count = machine_slots() if slots is None else slots
    where = folder or slot_folder()
    handles = [os.open(where / f"slot-{k}", os.O_RDWR | os.O_CREAT, 0o600) for k in range(count)]
    held = None
    try:
        while held is None:
            for k, handle in enumerate(handles):
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held = k
                break
            else:
                time.sleep(WAIT)
        yield held
    finally:
        for handle in handles:
            os.close(handle)  # closing drops the lock
