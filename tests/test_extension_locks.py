"""A torch extension build lock left by a killed process is removed, and one a live process
holds is not: with torch's own FileBaton (what `load_inline` takes) in real processes, and a real
`reprocut record` of a script whose `load_inline` would otherwise wait forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprocut.check import extension_locks
from reprocut.check.extension_locks import Sweeper, clear_stale, lock_files
from reprocut.model.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent

# holds torch's baton on `path` the way load_inline does (created O_EXCL, kept open) until killed
HOLDER = """\
import sys, time
from torch.utils.file_baton import FileBaton
baton = FileBaton(sys.argv[1])
assert baton.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold(lock: Path) -> subprocess.Popen[str]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def killed_inside(lock: Path) -> Path:
    """The lock as a process killed while holding it leaves it."""
    holder = hold(lock)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock.exists()
    return lock


@pytest.fixture
def extensions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    return root


def test_the_locks_are_looked_for_where_torch_builds(tmp_path: Path) -> None:
    mine = tmp_path / "mine" / "ext" / "lock"
    cached = tmp_path / "cache" / "torch_extensions" / "py312_cu130" / "ext" / "lock"
    for lock in (mine, cached):
        lock.parent.mkdir(parents=True)
        lock.touch()
    assert lock_files({"TORCH_EXTENSIONS_DIR": str(tmp_path / "mine")}) == [mine]
    assert lock_files({"XDG_CACHE_HOME": str(tmp_path / "cache")}) == [cached]


def test_a_lock_whose_process_was_killed_is_removed(extensions: Path) -> None:
    lock = killed_inside(extensions / "ext" / "lock")
    assert clear_stale() == ([lock], [])
    assert not lock.exists()


def test_a_lock_a_live_process_holds_is_kept(extensions: Path) -> None:
    lock = extensions / "ext" / "lock"
    holder = hold(lock)
    try:
        assert clear_stale() == ([], [])
        assert lock.exists()
    finally:
        holder.kill()
        holder.wait()


def test_the_sweeper_removes_a_lock_that_goes_stale_while_it_runs(extensions: Path) -> None:
    sweeper = Sweeper(interval=0.2).start()
    lock = killed_inside(extensions / "ext" / "lock")
    deadline = time.monotonic() + 10
    while lock.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not lock.exists()
    sweeper.close()
    assert sweeper.removed == [lock] and sweeper.left == []


MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
server:/export/home /home nfs4 rw,relatime 0 0
/dev/vdb /home/me/scratch ext4 rw 0 0
"""


def test_a_lock_on_a_network_filesystem_is_only_reported(
    extensions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another machine's process may hold it: /proc shows only this machine's."""
    assert extension_locks.filesystem_of(Path("/home/me/.cache/x/lock"), MOUNTS) == "nfs4"
    assert extension_locks.filesystem_of(Path("/home/me/scratch/x/lock"), MOUNTS) == "ext4"
    assert extension_locks.filesystem_of(Path("/homework/x"), MOUNTS) == "ext4"
    assert extension_locks.on_network(Path("/home/me/.cache/x/lock"), MOUNTS)
    assert not extension_locks.on_network(Path("/tmp/x/lock"), MOUNTS)
    lock = killed_inside(extensions / "ext" / "lock")
    monkeypatch.setattr(extension_locks, "on_network", lambda path: True)
    sweeper = Sweeper().start()
    sweeper.close()
    assert sweeper.left == [lock] and sweeper.removed == []
    assert lock.exists()


SCRIPT = """\
import torch
from torch.utils.cpp_extension import load_inline

SRC = "torch::Tensor twice(torch::Tensor x) { return x * 2; }"
ext = load_inline(name="lock_probe", cpp_sources=SRC, functions=["twice"])
x = ext.twice(torch.ones(3))
print(torch.ones(2, 3) @ x.reshape(3, 1)[:2])
"""


@pytest.mark.slow
def test_record_is_not_stalled_by_a_lock_a_killed_load_left(
    tmp_path: Path, extensions: Path
) -> None:
    """Without the removal, the script's load_inline waits for the lock forever."""
    lock = killed_inside(extensions / "lock_probe" / "lock")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == ExitCode.OK, done.stderr  # the matmul localized
    assert "mat1 and mat2 shapes cannot be multiplied" in done.stderr
    assert f"removed {lock}" in " ".join(done.stderr.split())
    assert not lock.exists()
    assert extension_locks.lock_files() == []
