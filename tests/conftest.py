"""Shared fixtures; the `cuda` marker skips tests when no CUDA GPU is present."""

from __future__ import annotations

import os

import pytest

# The machine-wide limit on checks in flight (reprocut.check.machine_slots) is for shrinks that
# share a machine; the suite's workers run unrelated tests, some of which time checks side by
# side, so it is off here except where a test sets one of its own.
os.environ.setdefault("REPROCUT_MACHINE_CHECKS", "0")


def _has_cuda() -> bool:
    # NVML-based check: does not initialise CUDA in the pytest process, so tests that fork
    # children (the oracle) stay safe after this runs.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
