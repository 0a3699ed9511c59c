"""The environment of reprocut's child processes (fork servers, probes, fresh checks).

Apart from oracle.py so that the `reprocut` command can start the fork server before it imports
anything heavy (see check/early_server.py): stdlib only.
"""

from __future__ import annotations

import os

from reprocut import PACKAGE_DIR
from reprocut.check.kernel_caches import with_kernel_caches

FORK_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # torch.cuda.is_available() without CUDA
BLOCKING_ENV = {"CUDA_LAUNCH_BLOCKING": "1", **FORK_ENV}


def package_root() -> str:
    """The folder holding the reprocut package: children import reprocut from there."""
    return os.path.dirname(PACKAGE_DIR)


def child_environment(*, blocking: bool = True) -> dict[str, str]:
    """The environment of reprocut's child processes, reprocut importable, the kernel caches
    shared (check/kernel_caches.py); with `blocking` (probes and localization), blocking
    launches, else the user's own environment as it is."""
    env = with_kernel_caches(os.environ)
    env.update(BLOCKING_ENV if blocking else FORK_ENV)
    root = package_root()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env
