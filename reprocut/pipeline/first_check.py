"""The recorded call's first check, started before this process has read its inputs.

`reprocut shrink` imports torch to read inputs.pt, and on an H200 host that import (4.7 s) takes
as long as the fork server's, which starts first: the first check waited for both, then took
half a second itself. It needs no values here: its script loads the captured tensors from the
recording's own inputs.pt (linked beside it as the sidecar), so it runs as soon as the server is
ready, on a thread, while this process is still importing torch. `pick_case` takes its verdict
when it is for the case it would check first.
"""

from __future__ import annotations

import threading
from pathlib import Path

from reprocut.check.oracle import Oracle, Verdict
from reprocut.model.case import ReproCase, Signature


class FirstCheck:
    """One case's check as it is (no CUDA_LAUNCH_BLOCKING variant), on a thread of its own."""

    def __init__(
        self, oracle: Oracle, case: ReproCase, expected: Signature, inputs_path: Path
    ) -> None:
        self.case = case
        self._verdict: Verdict | None = None
        # a folder of its own (the shrinker's checks write in the oracle's), gone with the oracle
        folder = oracle.workdir / "first-check"
        folder.mkdir(exist_ok=True)
        sidecar = inputs_path if inputs_path.exists() else None

        def run() -> None:
            try:
                self._verdict = oracle.check_case(
                    case, None, expected=expected, workdir=folder, sidecar_file=sidecar
                )
            except Exception:  # pick_case checks the case itself, and says what went wrong
                self._verdict = None

        self._thread = threading.Thread(target=run, name="reprocut-first-check", daemon=True)
        self._thread.start()

    def verdict_for(self, case: ReproCase) -> Verdict | None:
        """This check's verdict once it is done, if it was for `case` (else None)."""
        if case != self.case:
            return None
        self._thread.join()
        return self._verdict
