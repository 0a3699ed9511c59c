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
A `build_directory=` of the script's own choosing is not looked at.

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


def remove(paths: list[Path]) -> list[Path]:
    """Remove `paths`; those that were there to remove."""
    removed = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def clear_stale() -> list[Path]:
    """Remove the stale locks there are now (two looks, SETTLE_SECONDS apart)."""
    stale, _ = stale_locks()
    return remove(stale)


class Sweeper:
    """While reprocut's processes run (and may be killed), a daemon thread removes any lock
    that stays stale from one look to the next (SWEEP_SECONDS apart); `close` looks once more,
    after they have all ended. `removed`: every lock it removed, for the note the user gets."""

    def __init__(self, interval: float = SWEEP_SECONDS) -> None:
        self.removed: list[Path] = []
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reprocut-lock-sweeper", daemon=True)

    def start(self) -> Sweeper:
        self.removed += clear_stale()  # a lock left before this command would stall its runs
        self._thread.start()
        return self

    def _run(self) -> None:
        seen: dict[Path, int] = {}
        while not self._stop.wait(self._interval):
            stale, seen = stale_locks(seen)
            self.removed += remove(stale)

    def close(self) -> list[Path]:
        """Stop, look once more (every process of the command has ended), and say what went."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread.is_alive():
                self._thread.join(timeout=5)
            self.removed += clear_stale()
        return self.removed
