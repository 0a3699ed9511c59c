"""How many checks run at once on this machine, whichever shrink they belong to.

Each shrink checks several candidates side by side (its slots), which pays when it has the
machine to itself. Several shrinks at once (a team's jobs, a benchmark of four) then keep more
checks in flight than the machine runs faster: on the H200 four shrinks of four slots kept
9-13 CUDA checks in flight, each waiting seconds for its CUDA start, and a quarter of them were
cancelled or discarded once a candidate before them was accepted, their CUDA start already
paid. So a check first takes one of the machine's check slots: a lock file in a per-user
folder, held (flock) while the check runs and released by the kernel if its process dies. A
check waiting for one is cancelled for free: it never started.

A check that runs ahead of its turn (its shrink's candidates before it not yet answered) is a
bet: it is wasted if one of them is accepted. So the slots are ranked: a check with `ahead`
checks of its own shrink before it may take only the lowest `count >> ahead` slots (8 slots:
any of 8 for the check a shrink waits on, the lowest 4 one step ahead, 2, then 1), and looks
from the top of its range down. A shrink alone on the machine still runs its candidates side
by side; with several, the checks each one waits on are not kept waiting behind bets, and few
bets more than a step ahead run at all.

REPROCUT_MACHINE_CHECKS sets how many (0: no limit); the default is `default_count()`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS: no limit
    fcntl = None  # type: ignore[assignment]

COUNT_ENV = "REPROCUT_MACHINE_CHECKS"
POLL_SECONDS = 0.01


def default_count() -> int:
    """Checks in flight on this machine at most: half its cores, at least two."""
    return max(2, (os.cpu_count() or 2) // 2)


def configured_count() -> int:
    """REPROCUT_MACHINE_CHECKS if set (0: no limit), else the default."""
    value = os.environ.get(COUNT_ENV, "").strip()
    if value.isdigit():
        return int(value)
    return default_count()


def slots_folder() -> Path:
    """The lock files, one folder per user (every shrink of that user shares them)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"reprocut-{uid}" / "check-slots"


class MachineSlots:
    """`count` lock files; `held` waits for one of them."""

    def __init__(self, count: int | None = None, folder: Path | None = None) -> None:
        self.count = configured_count() if count is None else count
        self.folder = folder or slots_folder()
        if self.enabled:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    @property
    def enabled(self) -> bool:
        return self.count > 0 and fcntl is not None

    def allowed(self, ahead: int) -> int:
        """How many slots (the lowest) a check with `ahead` of its own before it may take."""
        return max(1, self.count >> max(0, ahead))

    @contextlib.contextmanager
    def held(
        self, cancelled: Callable[[], bool] = lambda: False, ahead: Callable[[], int] = lambda: 0
    ) -> Iterator[float | None]:
        """Hold a slot for the block: yields the seconds waited for it, or None when
        `cancelled()` became true first (the block then runs no check). `ahead()`: the checks of
        the same shrink before this one, asked again while it waits (they get answered)."""
        if not self.enabled:
            yield 0.0
            return
        started = time.perf_counter()
        held = self._wait(cancelled, ahead)
        if held is None:
            yield None
            return
        try:
            yield time.perf_counter() - started
        finally:
            os.close(held)  # closing the file releases its lock

    def _wait(self, cancelled: Callable[[], bool], ahead: Callable[[], int]) -> int | None:
        while True:
            for index in reversed(range(self.allowed(ahead()))):  # the lowest left to bets
                taken = self._try(index)
                if taken is not None:
                    return taken
            if cancelled():
                return None
            time.sleep(POLL_SECONDS)

    def _try(self, index: int) -> int | None:
        assert fcntl is not None
        fd = os.open(self.folder / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd
