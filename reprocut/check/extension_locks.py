"""torch's extension build locks left by a killed process, found and removed.

`torch.utils.cpp_extension.load` and `load_inline` take a lock file in the extension's build
folder (torch's `FileBaton`: created with O_EXCL, held open, removed when done) each time a
process loads the extension, built or not: a fresh process runs ninja there to see that nothing
changed. A process killed inside that window leaves the file behind, and every later load of that
extension, the user's own `python train.py` included, waits for it forever without a word.
reprocut kills processes as a matter of course (a cancelled candidate, a check past its time, an
interpreter started ahead and not needed), so it clears what its kills may leave: a lock file no
process holds open, seen so twice a moment apart (the owner closes its descriptor just before it
removes the file), in the build roots torch uses ($TORCH_EXTENSIONS_DIR, else the user's cache).
A `build_directory=` of the script's own choosing is not looked at, and a lock on a network
filesystem is only reported: a process of another machine may hold it, and /proc shows none.

Linux only (/proc); elsewhere nothing is removed. Stdlib only: the shrink's process has no torch.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

LOCK_NAME = "lock"  # torch.utils.cpp_extension's FileBaton, in each extension's build folder
SETTLE_SECONDS = 0.2  # between the two looks that call a lock stale
SWEEP_SECONDS = 2.0  # how often a Sweeper looks while reprocut's processes run
# filesystems another machine may share (a lock there may be held by a process /proc cannot see)
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
    "afs", "panfs", "wekafs", "9p", "virtiofs",
})  # fmt: skip


def lock_files(environ: dict[str, str] | None = None) -> list[Path]:
    """The extension build locks present now, in the roots torch builds in: under
    $TORCH_EXTENSIONS_DIR, `<root>/<name>/lock`; else, under the user's cache,
    `torch_extensions/<py>_<cu>/<name>/lock`."""
    env = os.environ if environ is None else environ
    root = env.get("TORCH_EXTENSIONS_DIR")
    if root:
        return sorted(Path(root).glob(f"*/{LOCK_NAME}"))
    cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return sorted((Path(cache) / "torch_extensions").glob(f"*/*/{LOCK_NAME}"))


def held_files() -> set[str] | None:
    """The paths of every file some process has open (those reprocut may read: the user's own),
    from /proc; None where there is no /proc to read."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    held: set[str] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or another user's
            for fd in os.scandir(entry / "fd"):
                with contextlib.suppress(OSError):
                    held.add(os.readlink(fd.path))
    return held


def _unheld(paths: list[Path]) -> dict[Path, int]:
    """Of `paths`, those that exist, are ours and no process has open: by inode."""
    if not paths:
        return {}
    held = held_files()
    if held is None:
        return {}
    found: dict[Path, int] = {}
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        if stat.st_uid == os.getuid() and os.path.realpath(path) not in held:
            found[path] = stat.st_ino
    return found


def stale_locks(seen: dict[Path, int] | None = None) -> tuple[list[Path], dict[Path, int]]:
    """The locks held by no process both now and when `seen` was taken (the same file: the
    same inode), and the unheld locks of this look that are not stale yet, for the next look.
    Without `seen`, two looks SETTLE_SECONDS apart."""
    if seen is None:
        seen = _unheld(lock_files())
        if not seen:
            return [], {}
        time.sleep(SETTLE_SECONDS)
    now = _unheld(lock_files())
    stale = [path for path, inode in now.items() if seen.get(path) == inode]
    return stale, {path: inode for path, inode in now.items() if path not in stale}


def filesystem_of(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem `path` lies on (its longest mount point in /proc/mounts, or
    in `mounts`, that file's text); None where that cannot be read."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    where = os.path.realpath(path)
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def on_network(path: Path, mounts: str | None = None) -> bool:
    """Whether `path` lies where another machine's process may hold it open (an NFS home, a
    cluster filesystem): /proc shows only this machine's."""
    kind = filesystem_of(path, mounts) or ""
    return kind in NETWORK_FILESYSTEMS or kind.startswith(("nfs", "fuse.sshfs", "fuse.gluster"))


def remove(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """Remove those of `paths` on a local filesystem: those removed, and those left (on a
    network filesystem, where no process here holding it does not mean none holds it)."""
    removed, left = [], []
    for path in paths:
        if on_network(path):
            left.append(path)
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed, left


def clear_stale() -> tuple[list[Path], list[Path]]:
    """Remove the stale locks there are now (two looks, SETTLE_SECONDS apart): `remove`'s
    removed and left."""
    stale, _ = stale_locks()
    return remove(stale)


class Sweeper:
    """While reprocut's processes run (and may be killed), a daemon thread removes any lock
    that stays stale from one look to the next (SWEEP_SECONDS apart); `close` looks once more,
    after they have all ended. For the notes the user gets: `removed`, every lock it removed,
    and `left`, those it found stale on a network filesystem and did not touch."""

    def __init__(self, interval: float = SWEEP_SECONDS) -> None:
        self.removed: list[Path] = []
        self.left: list[Path] = []
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reprocut-lock-sweeper", daemon=True)

    def start(self) -> Sweeper:
        self._settle(*clear_stale())  # a lock left before this command would stall its runs
        self._thread.start()
        return self

    def _settle(self, removed: list[Path], left: list[Path]) -> None:
        self.removed += removed
        self.left += [path for path in left if path not in self.left]

    def _run(self) -> None:
        seen: dict[Path, int] = {}
        while not self._stop.wait(self._interval):
            stale, seen = stale_locks(seen)
            self._settle(*remove(stale))

    def close(self) -> None:
        """Stop, and look once more: every process of the command has ended."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread.is_alive():
                self._thread.join(timeout=5)
            self._settle(*clear_stale())
