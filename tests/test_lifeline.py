"""However reprocut ends, the processes it started end too (real processes, real signals)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
SCRIPTS = Path(__file__).parent / "scripts"

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def running() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every running process (zombies aside)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]  # after "pid (comm) "
        if state != "Z":
            found[int(entry.name)] = (int(ppid), int(pgrp))
    return found


def live_members(pgid: int) -> list[int]:
    return [pid for pid, (_, group) in running().items() if group == pgid]


def children_of(parent: int) -> list[int]:
    return [pid for pid, (ppid, _) in running().items() if ppid == parent]


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def leftovers():
    """Process groups and pids a failing test must not leave behind (they sleep for minutes)."""
    groups: list[int] = []
    pids: list[int] = []
    yield groups, pids
    for kill, ids in ((os.killpg, groups), (os.kill, pids)):
        for target in ids:
            with contextlib.suppress(OSError):
                kill(target, signal.SIGKILL)


def wait_for_file(path: Path, process: subprocess.Popen, seconds: float = 120) -> str:
    def ready() -> bool:  # written, not just created: `open(...).write(...)` is two steps
        return (path.exists() and path.read_text().strip() != "") or process.poll() is not None

    assert wait_for(ready, seconds), f"{path} never appeared"
    assert path.exists(), f"the process ended first: {process.communicate()}"
    return path.read_text()


def _signals_as_a_shell_leaves_them() -> None:
    """The signals under test at their defaults in reprocut, whatever this test run inherited:
    under `nohup` SIGHUP is ignored, and reprocut rightly keeps ignoring it."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name
)
def test_killing_reprocut_record_ends_the_scripts_whole_group(tmp_path, signum, leftovers):
    report = tmp_path / "pids.txt"
    reprocut = subprocess.Popen(
        [sys.executable, "-m", "reprocut", "record", "--quiet", "--root", str(tmp_path / "rec"),
         str(SCRIPTS / "sleeps.py"), str(report)],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,  # our signal, and nobody else's, reaches it
        preexec_fn=_signals_as_a_shell_leaves_them,
    )  # fmt: skip
    script, pgid, helper = map(int, wait_for_file(report, reprocut).split())
    leftovers[0].append(pgid)
    assert pgid != os.getpgrp() and {script, helper} <= set(live_members(pgid))
    reprocut.send_signal(signum)
    returncode = reprocut.wait(timeout=30)
    assert wait_for(lambda: not live_members(pgid), 5), (
        f"still running after reprocut got {signum.name}: {live_members(pgid)}"
    )
    if signum == signal.SIGINT:
        assert returncode == 2, reprocut.stderr.read()  # interrupted
    else:
        assert returncode == -signum


ORACLE_PARENT = """
import sys
from pathlib import Path
from reprocut.check import lifeline
from reprocut.check.oracle import Oracle

lifeline.install_signal_handlers()  # as the reprocut command does
oracle = Oracle(fork=sys.argv[1] == "fork", timeout=300)
code = "import os, time\\nopen(%r, 'w').write(f'{os.getpid()} {os.getpgrp()}')\\ntime.sleep(300)\\n"
oracle.check_source(code % sys.argv[2], filename=sys.argv[3], cwd=Path(sys.argv[3]).parent)
"""


@pytest.mark.parametrize(
    ("mode", "signum"),
    [("fork", signal.SIGKILL), ("fresh", signal.SIGKILL), ("fork", signal.SIGTERM)],
    ids=["fork-SIGKILL", "fresh-SIGKILL", "fork-SIGTERM"],
)
def test_an_oracle_whose_parent_was_killed_ends_with_its_children(
    tmp_path, mode, signum, leftovers
):
    """Killed with SIGKILL, reprocut can do nothing: the fork server and the candidate it forked
    (or the fresh process of --no-fork) notice that their parent is gone and end. On SIGTERM
    reprocut kills the server, and the candidate notices that."""
    report = tmp_path / "pids.txt"
    parent = subprocess.Popen(
        [sys.executable, "-c", ORACLE_PARENT, mode, str(report), str(tmp_path / "repro.py")],
        env={**env(), "REPROCUT_FORKSERVER_WARMUP": "0"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    _candidate, candidate_group = map(int, wait_for_file(report, parent).split())
    started = children_of(parent.pid)  # the fork server, or the fresh process
    leftovers[0].append(candidate_group)
    leftovers[1].extend(started)
    assert started
    parent.send_signal(signum)
    assert parent.wait(timeout=30) == -signum
    assert wait_for(lambda: not live_members(candidate_group), 5), "the candidate survived"
    assert wait_for(lambda: not set(started) & set(running()), 5), "the server survived"
