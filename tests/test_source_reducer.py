"""The source reducer's loop: pure-Python predicates (fast), then real scripts run by the oracle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from reprocut.model.case import Signature, SourceLocation
from reprocut.model.errors import NotReproducedError
from reprocut.source.finish import ending_with_a_sync, format_code, tidy_layout
from reprocut.source.fixed_point import SourceReducer
from reprocut.source.focus import statement_text
from reprocut.source.passes import PASSES, PassContext, delete_statements
from reprocut.source.probe import probe_launch
from reprocut.source.recorded import reduce_recorded
from reprocut.source.reducer import reduce_source
from reprocut.source.results import SourceAccepted, SourceChecked, SourceRound
from reprocut.source.size import sort_key

BAD = Signature("ValueError", None, None, "bad value <n>")


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def run_in_process(source: str) -> Signature | None:
    """The candidate's failure, from running it here (these scripts are pure Python, no loops
    that could spin forever)."""
    try:
        exec(compile(source, "<candidate>", "exec"), {"__name__": "__main__"})
    except Exception as exc:
        message = str(exc)
        kind = "bad value <n>" if message.startswith("bad value") else message
        return Signature(type(exc).__name__, None, None, kind)
    return None


SCRIPT = code("""
    import math
    import json

    SCALE = 10


    def normalize(values, scale):
        total = sum(values)
        if total > scale * 3:
            raise ValueError(f"bad value {total}")
        return [v / scale for v in values]


    def summarize(rows):
        return {"mean": sum(rows) / len(rows), "max": max(rows)}


    def main():
        history = []
        for epoch in range(3):
            batch = [epoch * 7, SCALE, 5]
            normalized = normalize(batch, scale=SCALE)
            history.append(summarize(normalized))
            print(json.dumps(history[-1]), math.pi)


    if __name__ == "__main__":
        main()
""")


def reducer_for(source: str, check=run_in_process, **options) -> SourceReducer:
    return SourceReducer(
        best=source, expected=BAD, check=check, context=PassContext(), passes=PASSES, **options
    )


def test_the_loop_reaches_a_small_fixed_point():
    reducer = reducer_for(SCRIPT)
    assert reducer.run() == "fixed point"
    assert run_in_process(reducer.best) == BAD
    assert format_code(reducer.best) == code("""
        raise ValueError(f"bad value {0}")
    """)


def test_the_failing_call_is_kept_when_focused():
    reducer = SourceReducer(
        best=SCRIPT,
        expected=BAD,
        check=run_in_process,
        context=PassContext(focus="normalized = normalize(batch, scale=SCALE)"),
    )
    reducer.run()
    assert "normalize(" in reducer.best
    assert "def normalize" in reducer.best
    assert run_in_process(reducer.best) == BAD
    assert format_code(reducer.best) == code("""
        def normalize(values, scale):
            total = 0
            raise ValueError(f"bad value {total}")


        normalize(0, scale=0)
    """)


def test_another_failure_is_never_accepted():
    seen: list[Signature | None] = []

    def check(source: str) -> Signature | None:
        seen.append(run_in_process(source))
        return seen[-1]

    reducer = reducer_for(SCRIPT, check=check)
    reducer.run()
    assert run_in_process(reducer.best) == BAD
    others = {s.error_type for s in seen if s is not None and s != BAD}
    assert "NameError" in others  # candidates that drifted to another bug were tried, and refused


def test_consider_runs_nothing_for_a_candidate_that_is_not_smaller():
    calls: list[str] = []

    def check(source: str) -> Signature | None:
        calls.append(source)
        return BAD

    reducer = reducer_for(SCRIPT, check=check)
    assert not reducer.consider(SCRIPT)
    assert not reducer.consider(SCRIPT + "x = 1\n")
    assert calls == []
    smaller = SCRIPT.replace("import math\n", "")
    assert reducer.consider(smaller)
    assert not reducer.consider(smaller)  # seen: no second run
    assert calls == [smaller]


def test_every_accepted_candidate_is_reported_and_strictly_smaller():
    events: list[object] = []
    reducer = reducer_for(SCRIPT, on_event=events.append)
    reducer.run()
    accepted = [e for e in events if isinstance(e, SourceAccepted)]
    keys = [sort_key(SCRIPT), *(sort_key(e.code) for e in accepted)]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)
    assert accepted[-1].code == reducer.best
    assert sum(isinstance(e, SourceChecked) for e in events) == reducer.checks


def test_the_budget_stops_the_loop():
    reducer = reducer_for(SCRIPT, max_checks=3)
    assert reducer.run() == "max checks"
    assert reducer.checks == 3


def test_the_default_ends_when_a_round_removes_nothing_not_at_a_clock():
    """No time limit given: the loop ends after a whole round of passes whose candidates were
    all refused, well inside the safety cap; run again from there, it accepts nothing."""
    events: list[object] = []
    reducer = reducer_for(SCRIPT, on_event=events.append)
    started = time.monotonic()
    assert reducer.run() == "fixed point"
    assert time.monotonic() - started < 60  # the cap (600 s) is a net, never reached here
    last = max(i for i, e in enumerate(events) if isinstance(e, SourceAccepted))
    refused = [e for e in events[last + 1 :] if isinstance(e, SourceChecked)]
    assert refused and not any(e.accepted for e in refused)  # the final round: all refused
    # each round that changed the best says so, the last (which changed nothing) does not
    rounds = [i for i, e in enumerate(events) if isinstance(e, SourceRound)]
    assert rounds and rounds[-1] > last
    assert not any(isinstance(e, SourceAccepted) for e in events[rounds[-1] :])
    again = reducer_for(reducer.best)
    assert again.run() == "fixed point" and again.accepted == {}


def test_the_safety_cap_and_the_users_limit_each_say_that_they_stopped_it(monkeypatch):
    from reprocut.model import limits

    assert reducer_for(SCRIPT, max_time=0).run() == "max time"  # --max-time
    monkeypatch.setattr(limits, "SAFETY_CAP", 0.0)
    assert reducer_for(SCRIPT).run() == "safety cap"  # none given: the net


def test_sort_key_prefers_one_file_then_flat_code(tmp_path: Path):
    (tmp_path / "helpers.py").write_text("X = 1\n")
    dirs = (tmp_path,)
    assert sort_key("X = 1\nprint(X)\n", dirs) < sort_key("from helpers import X\n", dirs)
    flat = "x = next(iter(range(3)))\nprint(x)\nprint(x)\n"
    loop = "for x in range(3):\n    print(x)\n"
    assert sort_key(flat) < sort_key(loop)
    assert sort_key("n = 2\n") < sort_key("n = 64\n")


def test_reduce_source_refuses_a_script_that_does_not_fail(tmp_path: Path):
    script = tmp_path / "ok.py"
    script.write_text("print('fine')\n")
    with pytest.raises(NotReproducedError):
        reduce_source(
            script, cwd=tmp_path, argv=[], expected=BAD, check=run_in_process, passes=PASSES
        )


def test_with_several_slots_the_script_is_checked_beside_the_first_candidates(tmp_path: Path):
    """Its check no longer holds up the first candidates: one that fails is refused all the
    same (the reduction stops as soon as that is known), one that fails reduces as before."""
    script = tmp_path / "ok.py"
    script.write_text("print('fine')\n")
    seen: list[str] = []

    def slow_check(source: str) -> Signature | None:
        seen.append(source)
        if source == "print('fine')\n":
            time.sleep(0.5)  # the user's script: its candidates start meanwhile
        return run_in_process(source)

    with pytest.raises(NotReproducedError):
        reduce_source(script, cwd=tmp_path, argv=[], expected=BAD, check=slow_check,
                      passes=PASSES, parallel=2)  # fmt: skip
    assert len(seen) > 1  # candidates ran beside it, and the reduction stopped once it was known
    failing = (
        "import os\nx = [1, 2]\nprint(x)\nif x:\n    raise ValueError('bad value %d' % x[0])\n"
    )
    script.write_text(failing)
    seen.clear()
    result = reduce_source(script, cwd=tmp_path, argv=[], expected=BAD, check=slow_check,
                           passes=PASSES, parallel=2)  # fmt: skip
    alone = reduce_source(script, cwd=tmp_path, argv=[], expected=BAD, check=run_in_process,
                          passes=PASSES)  # fmt: skip
    assert result.code == alone.code and failing in seen and len(result.code) < len(failing)


PASTED = (
    '"""Header."""\n\nimport torch\nimport triton\n@triton.jit\ndef kernel(x_ptr):\n    pass\n'
    "# the input\nx = torch.ones(4)\n\n\n\n\nkernel[(1,)](x)\nclass A:\n    pass\n"
)


def test_tidy_layout_puts_pep8_blank_lines_between_top_level_statements():
    tidy = tidy_layout(PASTED)
    assert tidy == (
        '"""Header."""\n\nimport torch\nimport triton\n\n\n@triton.jit\ndef kernel(x_ptr):\n'
        "    pass\n\n\n# the input\nx = torch.ones(4)\n\n\nkernel[(1,)](x)\n\n\nclass A:\n"
        "    pass\n"
    )
    assert tidy_layout(tidy) == tidy
    assert tidy_layout("def (:\n") == "def (:\n"
    # what deleting the statements above the last leaves: no blank line before it
    assert tidy_layout("\n\n# why\nraise ValueError(1)\n") == "# why\nraise ValueError(1)\n"
    assert tidy_layout("\n\nraise ValueError(1)\n") == "raise ValueError(1)\n"


def test_without_ruff_the_result_is_tidied_not_left_as_pasted(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ruff to be found
    assert format_code(PASTED) == tidy_layout(PASTED)


def test_reduce_source_formats_the_result(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("import os\nx=[1,2]\nif x:\n    raise ValueError('bad value %d'%x[0])\n")
    result = reduce_source(
        script,
        cwd=tmp_path,
        argv=[],
        expected=BAD,
        check=run_in_process,
        passes=[delete_statements],
    )
    assert result.code == 'x = [1, 2]\nif x:\n    raise ValueError("bad value %d" % x[0])\n'
    assert result.lines == 3
    assert result.original_lines == 4
    assert result.accepted == (("delete_statements", 1),)
    assert result.stopped == "fixed point"


# --- real scripts, run by the oracle ---------------------------------------------------------

CASES = Path(__file__).resolve().parent.parent / "benchmarks" / "source_cases"


def copy_case(name: str, tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(CASES / name, project, ignore=shutil.ignore_patterns("__pycache__"))
    return project


def run_python(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_an_error_in_a_sibling_helper_reduces_to_one_small_file(tmp_path: Path):
    project = copy_case("helper_error", tmp_path)
    script = project / "train.py"
    expected = Signature("ValueError", None, None, "sequence of <n> tokens does not fit width <n>")
    result = reduce_source(
        script,
        cwd=project,
        argv=["--epochs", "2"],
        expected=expected,
        focus="tokens = pad_batch(rows, width=12)",
        max_time=300,
    )
    assert "import helpers" not in result.code and "from helpers" not in result.code
    assert "def pad_batch" in result.code  # the helper that failed is kept, not re-raised by hand
    assert result.lines <= 12 < result.original_lines
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "repro.py").write_text(result.code)
    done = run_python(alone / "repro.py", alone)
    assert "ValueError: sequence of" in done.stderr and "does not fit width" in done.stderr


@pytest.mark.slow
def test_probe_launch_reads_the_tensors_reaching_the_failing_call(tmp_path: Path):
    project = copy_case("numpy_kernel", tmp_path)
    script = project / "train.py"
    focus = "out = fused_bias_gelu(hidden, self.bias.expand_as(hidden))"
    line = script.read_text().splitlines().index(" " * 12 + focus) + 1
    launch = probe_launch(
        script, cwd=project, argv=[], file=script, line=line, focus=focus, timeout=120
    )
    hidden, bias = launch.args
    assert hidden is not None and hidden.shape == (16, 64) and hidden.stride is None
    assert bias is not None and bias.shape == (16, 64) and bias.stride == (0, 1)
    assert [name for name, _ in launch.params] == ["x"]


PACKED_FOCUS = "return cmvn_vec4(x, mean, 1 / std)"


def test_statement_text_spans_a_call_over_several_lines(tmp_path: Path):
    path = tmp_path / "m.py"
    path.write_text("x = 1\nout = launch(\n    x,\n    2,\n)\n")
    assert statement_text(path, 3) == "out = launch(\n    x,\n    2,\n)"
    assert statement_text(path, 1) == "x = 1"


@pytest.mark.slow
def test_reduce_recorded_finds_the_call_into_the_extension_and_jumps_to_it(tmp_path: Path):
    from reprocut.model.recording import ErrorInfo, Failure

    project = copy_case("packed_frames", tmp_path)
    raised_in = project / "vendor" / "vecext.py"
    failure = Failure(  # as `reprocut record` describes it: only the extension's line is known
        status="script-error",
        error=ErrorInfo("RuntimeError", "cmvn_vec4: misaligned address"),
        signature=Signature("RuntimeError", None, None, "cmvn_vec4: misaligned address"),
        source=SourceLocation(str(raised_in), 16, 'raise RuntimeError("cmvn_vec4: misaligned'),
        script=str(project / "train.py"),
        cwd=str(project),
    )
    result = reduce_recorded(failure, max_time=300)
    # the call into the extension (kernels.py) was found and probed the time it raised (step 4),
    # and the reduction cut straight to it: no training loop was cut down line by line
    accepted = dict(result.accepted)
    assert accepted["jump_ahead"] + accepted["jump_to_call"] == 1
    # the extension's wrapper is in a sibling module: the jump was made from the script with it
    # pasted in, before a check of the pasted script (which reruns the training) was paid for
    assert accepted["jump_ahead"] == 1 and accepted["inline_sibling_imports"] == 0
    assert ", 1170)" in result.code  # the offset view stays an offset view
    assert "FrameClassifier" not in result.code and "optimizer" not in result.code
    assert result.lines <= 8 < result.original_lines
    repro = project / "repro.py"
    repro.write_text(result.code)
    assert "RuntimeError: cmvn_vec4: misaligned address" in run_python(repro, project).stderr


# --- on the H200: the corpus's custom-kernel cases -------------------------------------------

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
MARKER = "# reprocut: culprit"
GPU_CASES = ("cuda_triton_expand_bias", "cuda_cupy_misaligned_vec4", "cuda_cupy_contiguous_pe")


def culprit(folder: Path) -> tuple[Path, int, str]:
    for path in sorted(folder.rglob("*.py")):
        for number, text in enumerate(path.read_text().splitlines(), start=1):
            if MARKER in text:
                return path, number, text.split(MARKER)[0].strip()
    raise AssertionError(f"no culprit marker in {folder}")


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("name", GPU_CASES)
def test_a_custom_kernel_fault_reduces_to_a_short_verified_script(name: str, tmp_path: Path):
    import tomllib

    source = CORPUS / name
    if not (source / "case.toml").exists():
        pytest.skip(f"corpus/{name} is missing")
    truth = tomllib.loads((source / "case.toml").read_text())["expected"]["cuda"]
    expected = Signature("RuntimeError", truth["error_code"], None, truth["kind"])
    project = tmp_path / name
    shutil.copytree(source, project, ignore=shutil.ignore_patterns("__pycache__", ".reprocut"))
    file, line, focus = culprit(project)
    script = project / "train.py"
    launch = probe_launch(script, cwd=project, argv=[], file=file, line=line, focus=focus)
    result = reduce_source(
        script,
        cwd=project,
        argv=[],
        expected=expected,
        specs=launch.args,
        named_specs=launch.params,
        named_values=launch.values,
        focus=focus,
        max_time=480,
        timeout=120,
    )
    assert result.lines <= 30, result.code
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "repro.py").write_text(result.code)
    done = subprocess.run(
        [sys.executable, str(alone / "repro.py")],
        cwd=alone,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"},
    )
    assert truth["kind"] in done.stderr, done.stderr[-2000:]


LAYER_LAUNCH = """\
import torch
import triton
import triton.language as tl


@triton.jit
def add_bias_kernel(x_ptr, bias_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(bias_ptr + offs, mask=mask)  # as if bias were contiguous like x
    tl.store(out_ptr + offs, x + b, mask=mask)


class BiasLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(256, 1, 4096, device="cuda"))

    def forward(self, x):
        bias = self.bias.expand(-1, x.shape[1], -1)  # stride 0 over tokens: 4 MB of storage
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        add_bias_kernel[grid](x, bias, out, n, BLOCK=1024)  # reprocut: culprit
        return out


def main():
    model = BiasLayer()
    for step in range(3):
        x = torch.randn(256, 256, 4096, device="cuda")  # 1 GiB, read through the 4 MB bias
        model(x).sum().item()


if __name__ == "__main__":
    main()
"""


@pytest.mark.cuda
@pytest.mark.slow
def test_a_triton_launch_in_a_models_forward_is_cut_to_the_launch_alone(tmp_path: Path):
    """`forward(self, x)` cannot be called on what the probe read (no `self`) and `main()`
    takes no tensors: the jump makes the launch alone, `n` and the grid from the probe."""
    script = tmp_path / "train.py"
    script.write_text(LAYER_LAUNCH)
    file, line, focus = culprit(tmp_path)
    launch = probe_launch(script, cwd=tmp_path, argv=[], file=file, line=line, focus=focus)
    assert launch.launch.grid is not None and launch.launch.args[3] == 256 * 256 * 4096
    expected = Signature("RuntimeError", 700, None, "an illegal memory access was encountered")
    result = reduce_source(
        script, cwd=tmp_path, argv=[], expected=expected, specs=launch.args,
        named_specs=launch.params, named_values=launch.values, call_values=launch.launch,
        focus=focus, timeout=120,
    )  # fmt: skip
    assert dict(result.accepted).get("jump_to_call") == 1, result.code
    assert result.lines <= 20 and "class BiasLayer" not in result.code, result.code
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "repro.py").write_text(result.code)
    done = subprocess.run(
        [sys.executable, str(alone / "repro.py")], cwd=alone, capture_output=True, text=True,
        timeout=300, env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"},
    )  # fmt: skip
    assert "illegal memory access" in done.stderr, done.stderr[-2000:]


def test_pin_script_dir_keeps_sibling_imports_working_anywhere():
    from reprocut.source.recorded import pin_script_dir

    code = (
        "import os, sys\n"
        'sys.path.insert(0, os.path.join(os.path.dirname(__file__), "vendor"))\n'
        'data = Path(__file__).parent / "x"\n'
    )
    assert pin_script_dir(code, Path("/work/s")) == (
        "import os, sys\n"
        "sys.path.insert(0, os.path.join('/work/s', \"vendor\"))\n"
        "data = Path('/work/s') / \"x\"\n"
    )


def test_a_user_module_the_reduction_kept_is_found_from_anywhere(tmp_path: Path):
    """A module whose state the script sets (`ops.SCALE = ...`) stays imported, not inlined:
    the repro puts the script's folder on sys.path (once), as the script had it as sys.path[0]."""
    from reprocut.source.recorded import pin_script_dir

    (tmp_path / "ops.py").write_text("SCALE = None\n")
    pinned = pin_script_dir("import ops\nops.SCALE = 0\n", tmp_path)
    assert (
        pinned == f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport ops\nops.SCALE = 0\n"
    )
    assert pin_script_dir(pinned, tmp_path) == pinned
    assert pin_script_dir("import torch\n", tmp_path) == "import torch\n"  # nothing of theirs


@pytest.mark.slow
def test_record_reads_the_kernel_and_the_tensors_reaching_a_launch(tmp_path: Path):
    """What `record` adds to a fault outside the dispatcher (on a GPU, after the blocking rerun
    named the launch line): the launched kernel's own name and the layout facts of its inputs."""
    from reprocut.localize.failure import LocalizeOptions
    from reprocut.localize.launch import _launch_inputs
    from reprocut.model.recording import RunDir

    project = copy_case("packed_frames", tmp_path)
    kernels = project / "kernels.py"
    line = kernels.read_text().splitlines().index("    " + PACKED_FOCUS) + 1
    options = LocalizeOptions(
        script=project / "train.py", argv=(), run_dir=RunDir(tmp_path / "run"), cwd=project
    )
    kernel, tensors = _launch_inputs(options, SourceLocation(str(kernels), line, PACKED_FOCUS))
    assert kernel == "cmvn_vec4"  # the launched function's own name
    # steps 0-3 call the kernel with aligned slices; the probe reads the call that raised:
    # step 4's third utterance, at 90 frames * 13 features = 1170 (mean, 1 / std: not tensors)
    assert [t.name for t in tensors] == ["x"]
    assert tensors[0].facts == ("storage offset 1170 (4680 bytes: not 16-byte aligned)",)


def test_a_gpu_repro_ends_by_waiting_for_the_gpu():
    # without the wait, a fault still queued at the end surfaces at teardown, exit status 0
    cupy_launch = "from __future__ import annotations\nimport cupy\nkernel((1,), (32,), args)\n"
    assert ending_with_a_sync(cupy_launch + "x.to('cuda')\n") == (
        "from __future__ import annotations\nimport torch\nimport cupy\n"
        "kernel((1,), (32,), args)\nx.to('cuda')\ntorch.cuda.synchronize()\n"
    )
    on_gpu = 'import torch\nx = torch.ones(2, device="cuda")\n'
    assert ending_with_a_sync(on_gpu) == on_gpu + "torch.cuda.synchronize()\n"
    for unchanged in ("import torch\nx = torch.ones(2)\n", on_gpu + "torch.cuda.synchronize()\n"):
        assert ending_with_a_sync(unchanged) == unchanged


def test_the_wait_and_the_format_cost_one_check_together_and_each_alone_only_if_needed():
    from reprocut.source.reducer import _finished

    sig = Signature("ValueError", None, None, "bad")
    best = 'import torch\nx = torch.ones(2, device="cuda")\n'
    seen: list[str] = []

    def check(needs: str):
        def run(candidate: str):
            seen.append(candidate)
            return sig if needs not in candidate else None  # fails unless `needs` is there

        return run

    reducer = SourceReducer(
        best=best, expected=sig, check=check("never"), context=PassContext(), passes=()
    )
    both = _finished(best, check("never"), reducer)
    assert both.endswith("torch.cuda.synchronize()\n") and len(seen) == 1
    seen.clear()
    alone = _finished(best, check("synchronize"), reducer)  # the wait spoils it
    assert "synchronize" not in alone and len(seen) >= 1
    assert all("synchronize" in c or c == format_code(best) for c in seen)


POOL = code("""
    def pool(ids, count):
        out = [0] * count
        for i in ids:
            if i >= len(out):
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {len(out)}")
            out[i] += 1
        return out


    pool([0, 1, 6], 6)
""")


def verdict_in_process(source: str):
    """The candidate's failure as the oracle gives it: a Verdict with the message."""
    from reprocut.check.oracle import OtherFailure, Passed, Reproduced
    from reprocut.model.signature import classify

    try:
        exec(compile(source, "<candidate>", "exec"), {"__name__": "__main__"})
    except Exception as exc:
        signature = classify(type(exc).__name__, str(exc))
        kind = Reproduced if signature.matches(OUT_OF_BOUNDS) else OtherFailure
        return kind(signature, str(exc), "", 0.0)
    return Passed(0.0)


OUT_OF_BOUNDS = Signature("IndexError", None, None, "index <n> is out of bounds for axis <n> with size <n>")  # fmt: skip


def test_the_reduction_keeps_how_the_numbers_of_the_message_relate_and_so_the_bug():
    """Unguarded, the integers shrink to 0 and the error says "index 0": the same kind,
    another bug; with the original's message its numbers relate as they did."""
    from reprocut.model.signature import same_numbers

    context = PassContext(focus="pool([0, 1, 6], 6)")
    message = verdict_in_process(POOL).message
    loose = SourceReducer(POOL, OUT_OF_BOUNDS, verdict_in_process, context)
    loose.run()
    assert not same_numbers(message, verdict_in_process(loose.best).message)  # slid
    guarded = SourceReducer(POOL, OUT_OF_BOUNDS, verdict_in_process, context, message=message)
    assert guarded.run() == "fixed point"
    assert same_numbers(message, verdict_in_process(guarded.best).message)
