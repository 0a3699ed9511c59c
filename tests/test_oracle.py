"""The oracle against a real fork server and real fresh processes: every outcome is a Verdict."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_lifeline import children_of

from reprocut.check.oracle import Crashed, Oracle, OtherFailure, Passed, Reproduced, TimedOut
from reprocut.model.case import Generated, Literal, ReproCase, Signature, TensorSpec

EMBEDDING = Signature("IndexError", None, "aten::embedding", "index out of range in self")


def embedding_case(ids: tuple[int, ...] = (1000,), device: str = "cpu") -> ReproCase:
    return ReproCase(
        "torch.nn.functional.embedding",
        (
            TensorSpec((len(ids),), dtype="int64", device=device, values=Literal(ids)),
            TensorSpec((10, 3), device=device, values=Generated("randn")),
        ),
        expected=EMBEDDING,
        aten_op="aten::embedding",
    )


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    with Oracle(timeout=60) as shared:
        yield shared


def run(oracle: Oracle, code: str, tmp_path: Path, timeout: float | None = None):
    return oracle.check_source(
        code, filename=str(tmp_path / "candidate.py"), cwd=tmp_path, timeout=timeout
    )


def test_passing_case(oracle: Oracle) -> None:
    verdict = oracle.check_case(embedding_case((1, 2)))
    assert isinstance(verdict, Passed)


def test_cpu_index_error_reproduces_with_the_op_attributed(oracle: Oracle) -> None:
    verdict = oracle.check_case(embedding_case((1, 1000)))
    assert isinstance(verdict, Reproduced)
    assert verdict.signature.op == "aten::embedding"
    assert verdict.signature.kind == "index out of range in self"


def test_a_different_error_is_other_failure(oracle: Oracle) -> None:
    case = ReproCase(
        "torch.nn.functional.one_hot",
        (TensorSpec((1,), dtype="int64", values=Literal((5,))), 3),
        expected=EMBEDDING,
    )
    verdict = oracle.check_case(case)
    assert isinstance(verdict, OtherFailure)
    assert verdict.signature.op == "torch.nn.functional.one_hot"  # composite: no aten op raised
    assert verdict.signature.error_type == "RuntimeError"


def test_hang_times_out_and_the_server_keeps_working(oracle: Oracle, tmp_path: Path) -> None:
    verdict = run(oracle, "import time\ntime.sleep(600)\n", tmp_path, timeout=1.0)
    assert isinstance(verdict, TimedOut)
    assert isinstance(oracle.check_case(embedding_case()), Reproduced)


def test_abort_is_crashed_and_the_server_keeps_working(oracle: Oracle, tmp_path: Path) -> None:
    verdict = run(oracle, "import os\nos.abort()\n", tmp_path)
    assert isinstance(verdict, Crashed)
    assert verdict.returncode == -6
    assert isinstance(oracle.check_case(embedding_case()), Reproduced)


def test_script_sees_main_argv_cwd_and_its_own_stdout(oracle: Oracle, tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    code = (
        "import os, sys\n"
        "import helper\n"
        "print(__name__, sys.argv[1:], os.getcwd() == os.path.dirname(__file__), helper.VALUE)\n"
    )
    verdict = oracle.check_source(
        code, filename=str(tmp_path / "train.py"), cwd=tmp_path, argv=["--epochs", "3"]
    )
    assert isinstance(verdict, Passed)
    assert verdict.stdout.strip() == "__main__ ['--epochs', '3'] True 42"


def test_the_server_is_restarted_when_it_dies(tmp_path: Path) -> None:
    with Oracle(timeout=30) as oracle:
        assert isinstance(oracle.check_case(embedding_case()), Reproduced)
        assert oracle._server is not None
        oracle._server.kill()
        oracle._server.wait()
        assert isinstance(oracle.check_case(embedding_case()), Reproduced)
        assert oracle.checks == 2


def test_no_fork_mode_gives_the_same_verdicts(tmp_path: Path) -> None:
    with Oracle(fork=False, timeout=60) as oracle:
        assert isinstance(oracle.check_case(embedding_case()), Reproduced)
        assert isinstance(oracle.check_case(embedding_case((1,))), Passed)
        assert isinstance(
            run(oracle, "import time\ntime.sleep(600)\n", tmp_path, timeout=2.0), TimedOut
        )
        assert isinstance(run(oracle, "import os\nos.abort()\n", tmp_path), Crashed)
        assert oracle.checks == 4


# --- on a GPU (the lead runs these on the H200) ------------------------------------------------

CUDA_ASSERT = Signature("AcceleratorError", 710, "aten::embedding", "index out of bounds")


@pytest.mark.cuda
def test_device_assert_in_one_child_leaves_the_next_child_unharmed() -> None:
    with Oracle(timeout=120) as oracle:
        bad = embedding_case((1000,), device="cuda")
        verdict = oracle.check_case(bad, expected=CUDA_ASSERT)
        assert isinstance(verdict, Reproduced), verdict
        assert verdict.signature.error_code == 710
        assert isinstance(oracle.check_case(embedding_case((1,), device="cuda")), Passed)
        assert isinstance(oracle.check_case(bad, expected=CUDA_ASSERT), Reproduced)


@pytest.mark.cuda
def test_device_assert_kind_survives_a_kernel_change() -> None:
    """One element goes through indexSelectSmallIndex, many through another kernel: same kind."""
    with Oracle(timeout=120) as oracle:
        small = oracle.check_case(embedding_case((1000,), device="cuda"), expected=CUDA_ASSERT)
        large = oracle.check_case(
            embedding_case((1,) * 4095 + (1000,), device="cuda"), expected=CUDA_ASSERT
        )
        assert isinstance(small, Reproduced), small
        assert isinstance(large, Reproduced), large


def test_falls_back_to_fresh_processes_when_fork_is_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    from reprocut.check.oracle import ForkUnsafeError

    def unsafe(self: Oracle) -> None:
        raise ForkUnsafeError("CUDA was initialised in the fork server before forking")

    monkeypatch.setattr(Oracle, "_start_server", unsafe)
    with Oracle(timeout=60) as oracle:
        assert isinstance(oracle.check_case(embedding_case()), Reproduced)
        assert oracle.fork is False
        assert oracle.fork_disabled is not None and "CUDA" in oracle.fork_disabled


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_standby_depth_keeps_that_many_children_waiting(tmp_path: Path) -> None:
    """With standby_depth 2 the server keeps two children waiting: the next check's child has
    started (its CUDA context, on a GPU) while the one before it ran."""
    code = "import os\nprint(os.getpid())\n"
    with Oracle(timeout=30, standby_cuda=True) as oracle:
        oracle.standby_depth = 2
        oracle.warm_up()
        first = oracle.prepare()
        assert oracle._server is not None
        server = oracle._server.pid
        waiting = set(children_of(server))
        assert len(waiting) == 2 and first in waiting
        verdict = run(oracle, code, tmp_path)
        assert isinstance(verdict, Passed) and int(verdict.stdout) == first
        deadline = time.monotonic() + 10
        while first in set(children_of(server)) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = oracle.prepare()
        assert second in waiting  # forked before the first check, not after it
        assert len(set(children_of(server))) == 2  # refilled
        verdict = run(oracle, code, tmp_path)
        assert int(verdict.stdout) == second


def test_standby_children_serve_the_next_checks(tmp_path: Path) -> None:
    """With standby_cuda each check runs in a child forked before it was asked for (on CPU the
    child has no CUDA context to make); verdicts, timeouts and crashes are as usual."""
    code = "import os\nprint(os.getpid(), os.getppid())\n"
    with Oracle(timeout=30, standby_cuda=True) as oracle:
        oracle.warm_up()
        standby = oracle.prepare()
        assert oracle._server is not None
        server = oracle._server.pid
        assert oracle.prepare() == standby  # one at a time
        pids = []
        for _ in range(3):
            verdict = run(oracle, code, tmp_path)
            assert isinstance(verdict, Passed)
            pid, parent = map(int, verdict.stdout.split())
            assert parent == server
            pids.append(pid)
        assert pids[0] == standby
        assert len(set(pids)) == 3  # a fresh child each time
        assert isinstance(run(oracle, "import os\nos.abort()\n", tmp_path), Crashed)
        assert isinstance(run(oracle, "import time\ntime.sleep(60)\n", tmp_path, 1.0), TimedOut)
        assert isinstance(oracle.check_case(embedding_case()), Reproduced)
