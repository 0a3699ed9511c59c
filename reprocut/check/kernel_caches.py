"""One kernel cache for every process that checks or verifies a candidate of a shrink.

A candidate whose kernel source did not change must not compile it again: Triton keys its cache
by the kernel's source and options, torch's `load_inline`/`load` rebuild (ninja) only what
changed in the extension's build folder. Both work only when every process looks in the same
folder: the fork server's children, fresh-process checks, plain confirmations and the final
verification runs, the probes, compute-sanitizer. So all of them get TRITON_CACHE_DIR and
TORCH_EXTENSIONS_DIR set, to the user's own values when the shell set them, else to a per-user
cache (`$XDG_CACHE_HOME/reprocut/kernels`, `~/.cache` without it) that later shrinks of the same
code find warm; the extension builds are kept apart per Python and torch version (the same
extension name built against another torch must not be loaded). Stdlib only: the fork server is
started before the command imports anything heavy.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

TRITON_CACHE = "TRITON_CACHE_DIR"
EXTENSIONS = "TORCH_EXTENSIONS_DIR"


def cache_root(env: Mapping[str, str]) -> Path:
    """The per-user folder of reprocut's kernel caches."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or Path.home(), ".cache")
    return Path(base) / "reprocut" / "kernels"


@lru_cache(maxsize=1)
def _build_tag() -> str:
    """`py311-torch2.13.0+cpu`: extension builds of one interpreter and torch."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "none"
    return f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch}"


def kernel_caches(env: Mapping[str, str]) -> dict[str, str]:
    """The cache variables `env` lacks, with the folders every check of a shrink shares."""
    root = cache_root(env)
    wanted = {TRITON_CACHE: root / "triton", EXTENSIONS: root / "torch_extensions" / _build_tag()}
    return {name: str(folder) for name, folder in wanted.items() if not env.get(name)}


def with_kernel_caches(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's by default) with the shared kernel caches: the environment of a
    plain run of a candidate, as `python repro.py` has it otherwise."""
    base = dict(os.environ if env is None else env)
    return {**base, **kernel_caches(base)}
