"""The outcome is written the moment the culprit is known (record/inside/outcome.py), so a
process that never returns to reprocut's own reporting code still leaves its culprit, snapshots
and inputs: here a script that ends itself with os._exit in its error handler (on a GPU: a rank
killed by a gloo worker or teardown after its device assert)."""

from __future__ import annotations

import json
from pathlib import Path

from test_ranks import SCRIPTS, reprocut

from reprocut.model.errors import ExitCode


def test_a_script_that_ends_itself_in_its_error_handler_is_localized_in_process(tmp_path):
    done = reprocut(tmp_path, "record", "--json", "--quiet", str(SCRIPTS / "exits_in_handler.py"))
    assert done.returncode == ExitCode.OK, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["status"] == "localized" and report["localization"] == "in-process"
    assert (report["op"], report["step"]) == ("aten::embedding", 3)
    assert report["source"]["line"] == 15
    assert any("index max 12" in fact for fact in report["facts"])
    run = Path(report["run_dir"])
    outcome = json.loads((run / "record.outcome.json").read_text())
    assert outcome["early"] is True  # child.py's own last lines never ran
    assert outcome["culprit"]["op"] == "aten::embedding"
    assert outcome["error"]["type"] == "IndexError"
    assert (run / "inputs.pt").exists()
