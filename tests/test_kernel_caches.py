"""Every check of a shrink shares one Triton cache and one torch extensions folder.

The variables must reach the processes that run candidates (the fork server's children, the
plain runs), and what one check leaves in the folder must be there for the next: a candidate
whose kernel source did not change finds its build. A CUDA build is too slow for CI, so the
"kernel" here is a file keyed by its source's hash, built where torch builds extensions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprocut.check.kernel_caches import EXTENSIONS, TRITON_CACHE, kernel_caches
from reprocut.check.oracle import Oracle, Passed
from reprocut.check.verify import run_plain

BUILD = """
import hashlib, json, os, pathlib
source = "__global__ void k(float* x) { x[0] = 1; }"
folder = pathlib.Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "segext"
built = folder / (hashlib.sha256(source.encode()).hexdigest()[:16] + ".so")
reused = built.exists()
folder.mkdir(parents=True, exist_ok=True)
built.write_text(source)
seen = json.dumps({"reused": reused, "triton": os.environ.get("TRITON_CACHE_DIR"),
                   "extensions": os.environ.get("TORCH_EXTENSIONS_DIR")})
pathlib.Path(__file__).with_suffix(".json").write_text(seen)
print(seen)
"""


def test_the_users_own_cache_folders_are_kept(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), TRITON_CACHE: "/mine/triton"}
    caches = kernel_caches(env)
    assert TRITON_CACHE not in caches  # the shell's value stays
    assert Path(caches[EXTENSIONS]).is_relative_to(tmp_path / "reprocut" / "kernels")
    assert kernel_caches({**env, EXTENSIONS: "/mine/ext"}) == {}


def test_checks_and_plain_runs_share_the_folders_and_find_what_the_last_one_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(TRITON_CACHE, raising=False)
    monkeypatch.delenv(EXTENSIONS, raising=False)
    expected = kernel_caches({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    script = tmp_path / "candidate.py"
    script.write_text(BUILD)
    with Oracle() as oracle:  # its fork server started now, with this environment
        first, second = (
            oracle.check_source(BUILD, filename=str(script), cwd=tmp_path) for _ in range(2)
        )
    assert isinstance(first, Passed) and isinstance(second, Passed)
    seen = [json.loads(verdict.stdout) for verdict in (first, second)]
    assert [s["reused"] for s in seen] == [False, True]  # the second check found the build
    assert {(s["triton"], s["extensions"]) for s in seen} == {
        (expected[TRITON_CACHE], expected[EXTENSIONS])
    }
    assert run_plain(script, timeout=120).returncode == 0  # a plain confirmation or verification
    plain = json.loads(script.with_suffix(".json").read_text())
    assert plain == {"reused": True, "triton": expected[TRITON_CACHE],
                     "extensions": expected[EXTENSIONS]}  # fmt: skip
