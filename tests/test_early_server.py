"""`reprocut shrink` starts its fork server before importing the rest of itself: the shrink's
oracle adopts it, and one nobody takes is gone when the command ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_shrink_cli import embedding_recording

from reprocut.check import early_server
from reprocut.check.childenv import child_environment
from reprocut.check.oracle import Oracle
from reprocut.cli import main, wants_early_server
from reprocut.model.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent


def reprocut(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "reprocut", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def fork_servers_of(parent: int) -> list[int]:
    """Pids of live fork servers started by `parent` (their --parent), read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"reprocut.check.forkserver" not in argv or b"--parent" not in argv:
            continue
        if argv[argv.index(b"--parent") + 1] == str(parent).encode():
            found.append(int(entry.name))
    return found


def test_only_a_forking_shrink_starts_the_server_early() -> None:
    assert wants_early_server(["shrink"])
    assert wants_early_server(["shrink", "--json", "--out=x", "runs/1"])
    assert not wants_early_server(["shrink", "--no-fork"])
    assert not wants_early_server(["shrink", "--no-f"])  # argparse's abbreviation
    assert not wants_early_server(["shrink", "-h"])
    assert not wants_early_server(["shrink", "--help"])
    assert not wants_early_server(["record", "train.py"])
    assert not wants_early_server([])


@pytest.mark.slow
def test_the_shrink_adopts_the_server_started_before_its_imports(tmp_path: Path) -> None:
    run = embedding_recording(tmp_path)
    process = reprocut("shrink", "--json", "--runs", "1", str(run.path), cwd=tmp_path)
    out, err = process.communicate(timeout=300)
    assert process.returncode == ExitCode.OK, err
    result = json.loads(out)
    assert result["status"] == "verified"
    assert result["fork_server"]["started_early"] is True, result["fork_server"]
    assert result["fork_server"]["started_ahead_s"] >= 0
    assert "import_torch" in result["fork_server"]
    assert not fork_servers_of(process.pid)


def test_an_untaken_server_is_gone_after_a_usage_error(tmp_path: Path) -> None:
    process = reprocut("shrink", str(tmp_path / "nonexistent"), cwd=tmp_path)
    _, err = process.communicate(timeout=120)
    assert process.returncode == ExitCode.USAGE_ERROR, err
    assert not fork_servers_of(process.pid)


def test_the_command_kills_the_server_it_did_not_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[early_server.EarlyServer] = []
    spawn = early_server.spawn

    def spawn_and_keep() -> None:
        spawn()
        assert early_server._slot is not None
        started.append(early_server._slot)

    monkeypatch.setattr(early_server, "spawn", spawn_and_keep)
    assert main(["shrink", str(tmp_path / "nonexistent")]) == ExitCode.USAGE_ERROR
    assert len(started) == 1
    assert started[0].server.poll() is not None  # killed, and reaped
    assert not Path(started[0].folder.name).exists()
    assert early_server._slot is None


def test_an_oracle_takes_the_server_only_with_the_same_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    early_server.spawn()
    early = early_server._slot
    assert early is not None
    with Oracle(launch_blocking=True) as blocking:  # another environment: not asked for
        assert early_server._slot is early and blocking.workdir != Path(early.folder.name)
    monkeypatch.setenv("REPROCUT_TEST_CHANGED", "1")  # the environment changed since the spawn
    assert early_server.take(child_environment(blocking=False)) is None
    assert early.server.wait(timeout=30) is not None
    assert early_server._slot is None


@pytest.mark.slow
def test_a_script_reduction_leaves_torch_to_the_server(tmp_path: Path) -> None:
    """The shrink's own process never imports torch to reduce a script: its checks run in the
    server, and the recording holds the versions report.md names. On the H200 host, torch's
    import took the process 4.7 s before it could make a first candidate."""
    work = tmp_path / "project"
    shutil.copytree(ROOT / "benchmarks" / "source_cases" / "numpy_kernel", work)
    recorded = reprocut("record", "--quiet", "train.py", cwd=work)
    _, err = recorded.communicate(timeout=300)
    assert recorded.returncode == ExitCode.SCRIPT_ERROR, err
    shrink = (
        "import json, sys\n"
        "from reprocut.cli import main\n"
        "code = main(['shrink', '--source', '--json', '--runs', '1', '--out', 'out'])\n"
        "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}), file=sys.stderr)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", shrink], cwd=work, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    outcome = json.loads(done.stderr.strip().splitlines()[-1])
    assert outcome["code"] == ExitCode.OK, done.stderr
    assert json.loads(done.stdout)["status"] == "verified"
    assert outcome["torch"] is False
    assert "- PyTorch: 2." in (work / "out" / "report.md").read_text()  # the recording's
