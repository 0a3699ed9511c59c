"""The oracle made ready while the user's script runs: `record` replays snapshots (and
`--shrink` shrinks) in fork-server children, whose server imports torch (seconds) and whose first
child makes a CUDA context; both are started before they are needed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any


def gpu_present() -> bool:
    """An NVIDIA device node exists: asks no CUDA API (the parent must never touch CUDA)."""
    return os.path.exists("/dev/nvidiactl")


class OracleWarmer:
    """Snapshot replay needs the fork server (torch import: seconds), and each replay a CUDA
    context: both are made ready while the script runs, on a thread of their own (importing
    the oracle alone takes half a second that the script would otherwise wait for)."""

    def __init__(self, timeout: float) -> None:
        self.oracle: Any = None
        self._prepared = False
        self._thread = threading.Thread(target=self._warm, args=(timeout,), daemon=True)
        self._thread.start()

    def _warm(self, timeout: float) -> None:
        from reprocut.check.oracle import Oracle

        self.oracle = Oracle(timeout=timeout, standby_cuda=True)
        with contextlib.suppress(Exception):  # replay starts the server itself, or says why not
            self.oracle.warm_up()

    def ready(self) -> Any:
        """The oracle, once its server is up (None if even its import failed)."""
        self._thread.join()
        return self.oracle

    def close(self) -> None:
        """Called as `record` returns: the report is out, so the replay processes are killed
        without waiting for their CUDA contexts to be torn down."""
        if self.ready() is not None:
            self.oracle.close(wait=False)

    def on_line(self, line: str) -> None:
        """The script's output: at its first CUDA error, have the replay child make its CUDA
        context while the script's process winds down and the snapshots are read. Not sooner:
        a second context next to a running script costs it GPU memory, and on a GPU in
        exclusive-process mode it would take the device away from the script."""
        if self._prepared or not is_cuda_error_line(line):
            return
        self._prepared = True
        threading.Thread(target=self._prepare, daemon=True).start()

    def _prepare(self) -> None:
        if self.ready() is not None:
            with contextlib.suppress(Exception):
                self.oracle.prepare()
            with contextlib.suppress(Exception):  # `record --shrink`'s first plain run's
                from reprocut.check.plainrun import PlainRunner

                ahead = PlainRunner()
                ahead.warm_up()
                self.oracle.plain_ahead = ahead


def is_cuda_error_line(line: str) -> bool:
    """A line CUDA or PyTorch prints when a kernel fails (error text or device assertion)."""
    return "CUDA error" in line or (".cu:" in line and "Assertion" in line)
