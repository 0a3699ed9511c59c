"""The environment of reprocut's child processes (fork servers, probes, fresh checks).

Apart from oracle.py so that the `reprocut` command can start the fork server before it imports
anything heavy (see check/early_server.py): stdlib only.

The kernel caches (TRITON_CACHE_DIR, TORCH_EXTENSIONS_DIR) are left as the user's environment
has them, and so are the children of plain runs, verification and compute-sanitizer: every
process of a shrink finds its kernels where the user's own runs, the recording's included, put
them (Triton's and torch's default folders unless the shell set others). A folder of reprocut's
own was cold at a shrink's first check: on the H200 a `load_inline` extension's first check
built it again for 41 s after the recording had built it.
"""

from __future__ import annotations

import os
import re

from reprocut import PACKAGE_DIR

FORK_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # torch.cuda.is_available() without CUDA
BLOCKING_ENV = {"CUDA_LAUNCH_BLOCKING": "1", **FORK_ENV}
# One hardware work queue per CUDA context. A check's process makes a context and most end
# with it poisoned by the fault; on the H200 (benchmarks/results/cuda-start-cuda.md) eight such processes at once
# started their contexts in 0.45 s instead of 1.11 s with it, and the machine ran 4.4 faulting
# checks a second instead of 2.8 (11.1 instead of 5.0 that did not fault). Only checks get it,
# and not where the user set it: a plain run, the sanitizer and the verification run as the
# user's script does (the Oracle drops it if the first check reproduces only without it).
ONE_CONNECTION = ("CUDA_DEVICE_MAX_CONNECTIONS", "1")
# what in a script can change the environment its process's CUDA start (and torch's import)
# reads (CUDA_VISIBLE_DEVICES, PYTORCH_CUDA_ALLOC_CONF, CUDA_LAUNCH_BLOCKING): `os.environ[...]
# = `, `os.putenv`, ...; such a script runs where nothing was started ahead of it
SETS_ENVIRONMENT = re.compile(r"\benviron\b|\bputenv\b|\bunsetenv\b")


def package_root() -> str:
    """The folder holding the reprocut package: children import reprocut from there."""
    return os.path.dirname(PACKAGE_DIR)


def child_environment(*, blocking: bool = True, one_connection: bool = False) -> dict[str, str]:
    """The environment of reprocut's child processes, reprocut importable; with `blocking`
    (probes and localization), blocking launches, else the user's own environment as it is;
    `one_connection`: a check's (ONE_CONNECTION, unless the user's environment sets it)."""
    env = dict(os.environ)
    env.update(BLOCKING_ENV if blocking else FORK_ENV)
    if one_connection:
        env.setdefault(*ONE_CONNECTION)
    root = package_root()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env
