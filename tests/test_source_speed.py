"""The cost of source-reduction checks: which imports the fork server preloads, checks side by
side giving the one-at-a-time result, and the server's concurrent children (issue #11)."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pure_candidates import BAD, failure_of

from reprocut.check.oracle import Cancelled, Oracle, Passed, Ticket
from reprocut.check.preload import choose_preloads
from reprocut.model.case import Signature
from reprocut.source.checks import OracleChecks, preload_imports
from reprocut.source.fixed_point import SourceReducer
from reprocut.source.passes import PASSES, PassContext
from reprocut.source.reducer import reduce_source
from reprocut.source.results import SourceAccepted, SourceChecked
from reprocut.source.speculation import CallableChecks, Speculation, default_slots


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# --- what is preloaded ---------------------------------------------------------------------------


def test_installed_packages_are_preloaded_and_the_users_own_modules_are_not(tmp_path: Path):
    (tmp_path / "helpers.py").write_text(
        "import numpy as np\nfrom transformers import BertConfig\n"
    )
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "fastext.py").write_text("import rich\n")
    (tmp_path / "numpy.py").write_text("")  # never: the user's file shadows the installed one
    script = tmp_path / "train.py"
    script.write_text(
        code("""
        from __future__ import annotations
        import json
        import torch
        import helpers
        from .local import thing
        from fastext import kernel
        import pycuda.autoinit
        import libcst.matchers as m
        if True:
            import os
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        import hypothesis
    """)
    )
    choice = choose_preloads(script, (tmp_path,))
    assert choice.modules() == ("transformers", "rich", "libcst.matchers")
    assert [p.names for p in choice.preloads] == [("BertConfig",), (), ()]
    why = dict(choice.skipped)
    assert why["helpers"] == why["fastext"] == why["numpy"] == "the user's own module"
    assert why["local"] == "the user's own package"
    assert why["pycuda.autoinit"] == "makes a CUDA context when imported"
    assert why["hypothesis"].startswith("imported after the environment is written at train.py:")
    assert "json" not in why and "torch" not in why  # the standard library, torch: nothing to do


def test_torch_dynamo_is_preloaded_for_a_script_whose_first_step_imports_it(tmp_path: Path):
    """A custom op's registration or an optimizer's step imports torch._dynamo when first used
    (1.1 s here, in every check): the server imports it once for such a script, unless the
    script writes the environment before (dynamo reads it at import)."""
    (tmp_path / "ops.py").write_text("import torch\n\n@torch.library.custom_op('n::f', mutates_args=())\ndef f(x: torch.Tensor) -> torch.Tensor:\n    return x\n")  # fmt: skip
    script = tmp_path / "train.py"
    script.write_text("import torch\nimport ops\nx = torch.ones(2)\n")
    assert choose_preloads(script, (tmp_path,)).modules() == ("torch._dynamo",)
    script.write_text("import torch\nw = torch.ones(2)\nopt = torch.optim.SGD([w], lr=0.1)\n")
    assert choose_preloads(script, (tmp_path,)).modules() == ("torch._dynamo",)
    script.write_text("import os\nos.environ['TORCHDYNAMO_DISABLE'] = '1'\nimport ops\n")
    assert choose_preloads(script, (tmp_path,)).modules() == ()
    script.write_text("import torch\nprint(torch.ones(2).sum())\n")
    assert choose_preloads(script, (tmp_path,)).modules() == ()


def test_torch_dynamo_used_by_the_script_alone_waits_for_a_check_that_uses_it(tmp_path: Path):
    """A script reduction's cut to the failing call leaves the optimizer behind: torch._dynamo,
    which only the script's own training set-up uses, is imported by the server once a check the
    reduction waits on uses it. Checks ahead of their turn, and the user's script checked beside
    the first candidates, import it in their own child; a user module that uses it keeps it
    preloaded (every candidate importing that module needs it)."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nw = torch.ones(2)\nopt = torch.optim.SGD([w], lr=0.1)\n")
    choice = choose_preloads(script, (tmp_path,), defer_dynamo=True)
    assert choice.modules() == () and [p.module for p in choice.deferred] == ["torch._dynamo"]
    (tmp_path / "ops.py").write_text("import torch\n\nopt = torch.optim.SGD\n")
    script.write_text("import torch\nimport ops\nopt = torch.optim.SGD([torch.ones(2)], lr=0.1)\n")
    choice = choose_preloads(script, (tmp_path,), defer_dynamo=True)
    assert choice.modules() == ("torch._dynamo",) and choice.deferred == ()

    script.write_text("import torch\nw = torch.ones(2)\nopt = torch.optim.SGD([w], lr=0.1)\n")
    probe = "import sys\nprint('torch.' '_dynamo' in sys.modules)\n"  # names no dynamo user
    optimizer = "import torch\nprint(torch.optim.SGD([torch.ones(1)], lr=0.1))\n"
    with Oracle(timeout=60) as fresh:
        deferred = preload_imports(fresh, script, tmp_path, [], defer_dynamo=True).deferred
        checks = OracleChecks(fresh, script, cwd=tmp_path, argv=[], expected=BAD, timeout=60,
                              slots=2, deferred=deferred)  # fmt: skip
        try:

            def server_has_dynamo() -> bool:
                verdict = checks.run(probe, 0, Ticket())
                assert isinstance(verdict, Passed), verdict
                return verdict.stdout.split() == ["True"]

            assert not server_has_dynamo()
            ahead = Ticket()
            ahead.ahead = 1
            checks.run(optimizer, 1, ahead)  # begun ahead of its turn
            checks.run(optimizer, 2, None)  # the user's script, beside the first candidates
            assert not server_has_dynamo()
            assert isinstance(checks.run(optimizer, 0, Ticket()), Passed)  # waited on
            assert server_has_dynamo()
            assert fresh.preloaded is not None and fresh.preloaded["loaded"] == ["torch._dynamo"]
        finally:
            checks.close()


def test_a_module_that_is_not_installed_is_not_preloaded(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("import no_such_package_here\n")
    choice = choose_preloads(script, (tmp_path,))
    assert choice.preloads == ()
    assert dict(choice.skipped) == {"no_such_package_here": "not an installed package"}


@pytest.fixture(scope="module")
def oracle():
    with Oracle(timeout=60) as shared:
        yield shared


def test_the_server_imports_what_is_safe_and_refuses_a_module_that_starts_a_thread(
    oracle: Oracle, tmp_path: Path
):
    (tmp_path / "spinner.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    (tmp_path / "calm.py").write_text("VALUE = 7\n")
    script = tmp_path / "train.py"
    oracle.preload([["spinner", []], ["calm", ["VALUE"]]], filename=str(script), cwd=str(tmp_path),
                   argv=[])  # fmt: skip
    probe = "import sys\nprint(sorted(m for m in ('spinner', 'calm') if m in sys.modules))\n"
    verdict = oracle.check_source(probe, filename=str(tmp_path / "c.py"), cwd=tmp_path)
    assert isinstance(verdict, Passed), verdict
    assert verdict.stdout.strip() == "['calm']"  # imported once in the server, for every child
    assert oracle.preloaded is not None
    assert oracle.preloaded["loaded"] == ["calm"]
    assert oracle.preloaded["refused"] == {"spinner": "started a thread"}


def test_a_trusted_module_imports_without_a_trial_and_the_server_still_refuses_to_fork_if_spoiled(
    tmp_path: Path,
):
    """triton is imported with no trial child; one that starts a thread (here a file of that
    name first on the path) leaves the server unfit, and it is replaced by one without preloads."""
    (tmp_path / "triton.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    script = tmp_path / "train.py"
    probe = "import sys\nprint('triton' in sys.modules)\n"
    with Oracle(timeout=60) as own:
        own.preload([["triton", []]], filename=str(script), cwd=str(tmp_path), argv=[])
        verdict = own.check_source(probe, filename=str(tmp_path / "c.py"), cwd=tmp_path)
        assert isinstance(verdict, Passed), verdict
        assert verdict.stdout.strip() == "False"  # the new server has no preloads
        assert own.preloaded is not None and own.preloaded["unsafe"] == "started a thread"
        assert own.preloaded["loaded"] == ["triton"] and own.preloaded["refused"] == {}


def test_the_trial_child_imports_beside_the_servers_trusted_imports(tmp_path: Path):
    """The trial of an untrusted module runs while the server imports the trusted ones, not
    before them: the untrusted module, in its trial child, waits for the mark the trusted one
    (here a harmless file named triton first on the path) leaves as the server imports it."""
    mark, seen = tmp_path / "triton-imported", tmp_path / "seen.txt"
    (tmp_path / "triton.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    (tmp_path / "probe_mod.py").write_text(
        "import os, sys, time\n"
        "deadline = time.monotonic() + 30\n"
        f"while not os.path.exists({str(mark)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        f"with open({str(seen)!r}, 'a') as f:\n"
        f"    f.write(f\"{{'triton' in sys.modules}} {{os.path.exists({str(mark)!r})}}\\n\")\n"
    )
    script = tmp_path / "train.py"
    with Oracle(timeout=60) as own:
        own.preload([["triton", []], ["probe_mod", []]], filename=str(script),
                    cwd=str(tmp_path), argv=[])  # fmt: skip
        probe = "import sys\nprint('probe_mod' in sys.modules)\n"
        verdict = own.check_source(probe, filename=str(tmp_path / "c.py"), cwd=tmp_path)
        assert isinstance(verdict, Passed) and verdict.stdout.strip() == "True", verdict
        assert own.preloaded is not None
        assert own.preloaded["loaded"] == ["triton", "probe_mod"], own.preloaded
        assert own.preloaded["refused"] == {} and own.preloaded["unsafe"] is None
    # the trial child (forked before the server imported triton) saw the server's mark; then
    # the server imported it too
    assert seen.read_text().splitlines() == ["False True", "True True"]


def test_checks_run_side_by_side_and_one_can_be_cancelled(oracle: Oracle, tmp_path: Path):
    verdicts: dict[int, object] = {}

    def check(k: int) -> None:
        source = f"import time\ntime.sleep(1.5)\nprint({k})\n"
        verdicts[k] = oracle.check_source(source, filename=str(tmp_path / f"c{k}.py"), cwd=tmp_path)

    started = time.perf_counter()
    threads = [threading.Thread(target=check, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.perf_counter() - started < 4.0  # not 3 x 1.5 s
    assert {k: getattr(v, "stdout", "").strip() for k, v in verdicts.items()} == {
        0: "0", 1: "1", 2: "2"
    }  # fmt: skip
    ticket, cancelled = Ticket(), []
    hang = "import time\ntime.sleep(60)\n"
    thread = threading.Thread(target=lambda: cancelled.append(oracle.check_source(
        hang, filename=str(tmp_path / "h.py"), cwd=tmp_path, ticket=ticket)))  # fmt: skip
    started = time.perf_counter()
    thread.start()
    time.sleep(0.5)
    ticket.cancel()
    thread.join()
    assert isinstance(cancelled[0], Cancelled) and time.perf_counter() - started < 10


def test_a_scripts_candidate_runs_in_a_child_started_ahead_unless_it_sets_the_environment(
    tmp_path: Path,
):
    """A child whose CUDA context was made ahead saves a check its CUDA start (a few tenths of
    a second on the H200, more with four shrinks at once); a candidate that may set the
    environment CUDA reads (`os.environ`, in it or a module of the user's it imports) gets a
    child that starts after it. The pid each candidate prints says which child ran it."""
    from reprocut.source.checks import OracleChecks

    script = tmp_path / "train.py"
    script.write_text("raise ValueError('bad value 3')\n")
    (tmp_path / "settings.py").write_text("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n")
    prints = "import os\nprint(os.getpid())\n"
    with Oracle(BAD, timeout=60, standby_cuda=True) as oracle:
        checks = OracleChecks(oracle, script, cwd=tmp_path, argv=[], expected=BAD, timeout=60)
        assert isinstance(checks.run(prints, 0, None), Passed)  # the server is up
        for candidate, ahead in (
            (prints, True),
            (prints.replace("print", "os.environ['X'] = '1'\nprint"), False),
            ("import settings\n" + prints, False),
        ):
            waiting = oracle.prepare()
            assert waiting is not None
            verdict = checks.run(candidate, 0, None)
            assert isinstance(verdict, Passed), verdict
            assert (int(verdict.stdout.split()[0]) == waiting) is ahead, candidate


# --- side by side, the same result -----------------------------------------------------------------

SCRIPT = code("""
    import math
    import json

    SCALE = 10


    def normalize(values, scale):
        total = sum(values)
        if total > scale * 3:
            raise ValueError(f"bad value {total}")
        return [v / scale for v in values]


    def main():
        history = []
        for epoch in range(4):
            batch = [epoch * 7, SCALE, 5, epoch]
            normalized = normalize(batch, scale=SCALE)
            history.append(sum(normalized))
            print(json.dumps(history[-1]), math.pi)


    if __name__ == "__main__":
        main()
""")


def slow_pure_check(source: str) -> Signature | None:
    """The candidate's failure, run here; slower for some candidates, so verdicts of checks
    side by side come back out of order."""
    time.sleep(0.002 * (hash(source) % 5))
    return failure_of(source)


def reduce_with(parallel: int, **options) -> tuple[SourceReducer, str, list[object]]:
    events: list[object] = []
    reducer = SourceReducer(
        best=SCRIPT, expected=BAD, check=slow_pure_check, context=PassContext(), passes=PASSES,
        parallel=parallel, on_event=events.append, **options,
    )  # fmt: skip
    stopped = reducer.run()
    return reducer, stopped, events


def trail(events: list[object]) -> list[tuple[str, int, bool]]:
    return [(e.pass_name, e.checks, e.accepted) for e in events if isinstance(e, SourceChecked)]


@pytest.mark.parametrize("options", [{}, {"max_checks": 40}])
def test_checking_candidates_side_by_side_gives_the_one_at_a_time_result(options):
    """Without merging, speculation (the lookahead included) changes only the wall time."""
    one, stopped_one, events_one = reduce_with(1, merge=False, **options)
    many, stopped_many, events_many = reduce_with(4, merge=False, **options)
    assert many.best == one.best and stopped_many == stopped_one
    assert many.checks == one.checks and many.accepted == one.accepted
    assert trail(events_many) == trail(events_one)  # the same verdicts, in the same order
    accepted = [e.code for e in events_many if isinstance(e, SourceAccepted)]
    assert accepted == [e.code for e in events_one if isinstance(e, SourceAccepted)]
    if not options:
        assert many.discarded > 0  # speculative checks really ran past accepted candidates
        # and idle slots checked later passes' candidates, whose verdicts those passes took
        assert many.speculation().adopted > 0


def test_a_real_script_reduces_the_same_with_the_oracle_checking_side_by_side(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("import json", "import json\nimport torch"))
    results = [
        reduce_source(script, cwd=tmp_path, argv=[], expected=BAD, parallel=n, timeout=60)
        for n in (1, 2)
    ]
    assert results[0].code == results[1].code
    assert results[0].checks == results[1].checks
    assert results[0].accepted == results[1].accepted
    assert (results[0].parallel, results[1].parallel) == (1, 2)
    assert "raise ValueError" in results[1].code


# --- on the H200 (benchmarks/gpu_batch.sh, stage `tests`) -----------------------------------------


@pytest.mark.cuda
def test_triton_and_cupy_preloaded_leave_the_children_free_to_use_the_gpu(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("import triton\nimport triton.language as tl\nimport cupy\n")
    choice = choose_preloads(script, (tmp_path,))
    assert choice.modules() == ("triton", "triton.language", "cupy"), choice
    with Oracle(timeout=120) as gpu_oracle:
        gpu_oracle.preload([p.to_json() for p in choice.preloads], filename=str(script),
                           cwd=str(tmp_path), argv=[])  # fmt: skip
        probe = code("""
            import sys
            import cupy
            import torch
            x = torch.ones(4, device="cuda")
            print(int(x.sum().item()), int(cupy.ones(3).sum()), "triton" in sys.modules)
        """)
        for _ in range(2):  # every child makes its own context, after the server preloaded
            verdict = gpu_oracle.check_source(probe, filename=str(tmp_path / "c.py"), cwd=tmp_path)
            assert isinstance(verdict, Passed), verdict
            assert verdict.stdout.split() == ["4", "3", "True"]
        assert gpu_oracle.preloaded is not None
        assert set(gpu_oracle.preloaded["loaded"]) == {"triton", "triton.language", "cupy"}, (
            gpu_oracle.preloaded
        )


def test_the_candidates_in_flight_follow_the_cores():
    """Half the cores, at most four: a 2-core laptop checks one candidate at a time, the
    16-core H200 host four; and that many really run at once."""
    assert [default_slots(n) for n in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 4, 4]
    running, most, lock = [0], [0], threading.Lock()

    def check(candidate: str) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    class Refuses:
        best = ""

        def admissible(self, candidate: str, pass_name: str | None = None) -> bool:
            return True

        def upcoming(self) -> Iterator[tuple[str, str]]:
            return iter(())

        def out_of_budget(self, in_flight: int) -> str | None:
            return None

        def take(self, candidate: str, verdict: object, pass_name: str) -> bool:
            return False

    slots = default_slots(16)
    speculation = Speculation(CallableChecks(check, slots))
    try:
        options = [(k, f"x = {k}\n") for k in range(12)]
        assert speculation.first_accepted(Refuses(), options, "pass") is None
    finally:
        speculation.close()
    assert most[0] == slots


def test_the_scripts_own_check_is_cancelled_once_a_candidate_reproduces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The user's script, checked beside the first candidates, answers nothing the reduction
    needs once one of them reproduces (the message is known): its check is cancelled then, not
    run to its end beside the reduction (a whole training run, on a GPU shared with the
    candidates)."""
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv("REPROCUT_CHECK_LOG", str(log))
    script = tmp_path / "train.py"
    script.write_text(
        code('''
        """Only the whole script, docstring and all, takes its time."""
        import time

        if __doc__:
            time.sleep(120)  # the training before the failing step, as far as this test goes
        raise ValueError("bad value 1")
    ''')
    )
    result = reduce_source(script, cwd=tmp_path, argv=[], expected=BAD, parallel=2,
                           timeout=300, message="bad value 1")  # fmt: skip
    assert "sleep" not in result.code and 'raise ValueError("bad value 1")' in result.code
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (moot,) = [event for event in events if event["kind"] == "original_moot"]
    assert moot["answered"] is False
    checks = [event for event in events if event["kind"] == "check"]
    original = [event for event in checks if event["thread"].startswith("reprocut-original")]
    assert [event["verdict"] for event in original] == ["Cancelled"]
    assert all(event["seconds"] < 100 for event in original)
