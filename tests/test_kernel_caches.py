"""Every process of a shrink finds kernels where the user's own runs put them.

TRITON_CACHE_DIR and TORCH_EXTENSIONS_DIR are left as the user's environment has them (unset:
Triton's and torch's default folders), so what the recording's run built, and what one check
built, is there for the fork server's children, the plain runs and the verification: a
candidate whose kernel source did not change finds its build. A CUDA build is too slow for CI,
so the "kernel" here is a file keyed by its source's hash, put where torch builds extensions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.check.oracle import Oracle, Passed
from reprocut.check.verify import run_plain

BUILD = """
import hashlib, json, os, pathlib
from torch.utils.cpp_extension import get_default_build_root
source = "__global__ void k(float* x) { x[0] = 1; }"
root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
folder = pathlib.Path(root) / "segext"
built = folder / (hashlib.sha256(source.encode()).hexdigest()[:16] + ".so")
reused = built.exists()
folder.mkdir(parents=True, exist_ok=True)
built.write_text(source)
seen = json.dumps({"reused": reused, "root": root,
                   "triton": os.environ.get("TRITON_CACHE_DIR")})
pathlib.Path(__file__).with_suffix(".json").write_text(seen)
print(seen)
"""


@pytest.mark.parametrize("users_own", [False, True])
def test_a_build_of_the_users_run_is_found_by_checks_and_plain_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, users_own: bool
) -> None:
    """The user's run (the recording's) builds; the checks and a plain run find it there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # torch's default root
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    if users_own:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    else:
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    script = tmp_path / "candidate.py"
    script.write_text(BUILD)
    users_run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert users_run.returncode == 0, users_run.stderr
    root = json.loads(users_run.stdout)["root"]
    assert root.startswith(str(tmp_path / ("mine" if users_own else "cache")))
    with Oracle() as oracle:  # its fork server started now, with this environment
        verdict = oracle.check_source(BUILD, filename=str(script), cwd=tmp_path)
    assert isinstance(verdict, Passed)
    assert json.loads(verdict.stdout) == {"reused": True, "root": root, "triton": None}
    assert run_plain(script, timeout=120).returncode == 0  # a plain confirmation or verification
    assert json.loads(script.with_suffix(".json").read_text())["reused"]
