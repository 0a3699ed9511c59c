"""bench_shrink_start reads a command's start from its check log's wall-clock stamps."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_shrink_start import figures


def test_the_figures_count_from_the_launch(tmp_path: Path) -> None:
    events = [
        {"t": 101.0, "kind": "phase", "phase": "read"},
        {"t": 101.5, "kind": "phase", "phase": "fork_server", "seconds": 1.4},
        {"t": 103.0, "kind": "check", "verdict": "Reproduced"},
        {"t": 102.5, "kind": "check", "verdict": "Cancelled"},
    ]
    log = tmp_path / "checks.jsonl"
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    repro = tmp_path / "repro.py"
    repro.write_text("import torch\n\nx = torch.ones(2)\n")
    got = figures(100.0, 106.0, log, {"checks": 2}, repro)
    assert got == {"first_phase": 1.0, "server": 1.5, "first_check": 2.5, "total": 6.0,
                   "checks": 2, "lines": 2}  # fmt: skip
    assert figures(100.0, 101.0, log, {}, tmp_path / "none.py")["lines"] is None
