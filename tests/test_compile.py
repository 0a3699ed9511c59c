"""torch.compile: the verdict (fails eagerly too, or only compiled) and compile-only repros.

The corpus cases under corpus/compile/ run for real: reprocut records them (eagerly), runs them
once more compiled (real Inductor, in a plain child), and shrinks them; the compile-only repro
must fail compiled and pass with TORCH_COMPILE_DISABLE=1 when run here with plain `python`.
`cuda` tests do the same on a GPU, where the compiled kernel is a Triton one that
device-asserts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from reprocut.model.case import Generated, Literal, TensorSpec
from reprocut.model.compiled import CompileVerdict, compile_environment, inductor_evidence
from reprocut.model.signature import classify
from reprocut.record.parent.compiled_run import read_compiled
from reprocut.source.compiled_call import compiled_call_candidates

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "corpus" / "compile"


def _truth(name: str) -> dict:
    return tomllib.loads((CASES / name / "case.toml").read_text())


def _marker_line(script: Path) -> int:
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "# reprocut: culprit" in line)


def _record(name: str, root: Path, *extra: str, device: str = "cpu") -> tuple[dict, int]:
    folder = CASES / name
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--json", "--quiet", "--root", str(root),
         *extra, "train.py", "--device", device],
        cwd=folder, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout), done.returncode


def _run(repro: Path, *, compiled: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, repro.name], cwd=repro.parent, capture_output=True, text=True,
        timeout=300, env=compile_environment(compiled), check=False,
    )  # fmt: skip


def test_inductor_messages_keep_a_signature_across_compiles() -> None:
    """The cache file (a hash) and temporaries' numbers change from compile to compile."""
    first = (
        "kernel, /tmp/torchinductor_a/ih/cihu3e.main.cpp:29, index out of bounds: 0 <= tmp13 < 16L"
    )
    second = (
        "kernel, /tmp/torchinductor_b/x1/c9f2aa.main.cpp:21, index out of bounds: 0 <= tmp2 < 64L"
    )
    assert classify("RuntimeError", first) == classify("RuntimeError", second)
    kernel, assertion, kernel_file = inductor_evidence(
        '  File "/tmp/torchinductor_a/ea/ceauch.py", line 94, in call\n'
        "    cpp_fused_embedding_sum_0(primals_2, primals_1, buf0)\n"
        f"RuntimeError: {first}\n"
    )
    assert kernel == "cpp_fused_embedding_sum_0"
    assert assertion == "index out of bounds: 0 <= tmp13 < 16L"
    assert kernel_file == "/tmp/torchinductor_a/ih/cihu3e.main.cpp"


def test_a_device_assert_names_the_triton_kernel_that_asserted() -> None:
    """On a GPU the error surfaces later (another kernel in the traceback); the assertion line
    names the kernel that asserted."""
    output = (
        "/tmp/torchinductor_u/ab/cab12.py:45: triton_poi_fused_embedding_0: block: [3,0,0], "
        "thread: [0,0,0] Assertion `index out of bounds: 0 <= tmp4 < 64` failed.\n"
        "Traceback (most recent call last):\n"
        '  File "/tmp/torchinductor_u/cd/ccd34.py", line 80, in call\n'
        "    triton_per_fused_mean_1.run(buf2, buf3)\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
    )
    run = read_compiled(output, 1, 1.0)
    assert run.kernel == "triton_poi_fused_embedding_0"
    assert run.assertion == "index out of bounds: 0 <= tmp4 < 64"
    assert classify("AcceleratorError", run.message, output).kind == "index out of bounds"


def test_a_cuda_fault_names_no_inductor_kernel_it_merely_surfaced_at() -> None:
    """corpus/cuda_triton_op_compiled on the H200: a custom op's own Triton kernel
    (`gated_kernel`, named by memcheck) read out of bounds inside the compiled model; the error
    surfaced at the launch of the Inductor kernel after it, which the report then named as
    "Inductor-generated kernel: `triton_poi_fused_gelu_0`". Only an assert names a kernel."""
    output = (
        "Traceback (most recent call last):\n"
        '  File "/root/corpus/cuda_triton_op_compiled/train.py", line 32, in forward\n'
        "    return self.out(F.gelu(gated(h, gate)))  # reprocut: culprit\n"
        '  File "/tmp/torchinductor_root/qx/cqxkq5.py", line 121, in call\n'
        "    triton_poi_fused_gelu_0.run(buf3, buf4, 33554432, stream=stream0)\n"
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
    )
    run = read_compiled(output, 1, 30.0)
    assert run.kernel is None and run.assertion is None
    assert (
        run.describe() == "AcceleratorError: CUDA error: an illegal memory access was encountered"
    )
    assert run.kernel_file == "/tmp/torchinductor_root/qx/cqxkq5.py"  # the traceback's, kept
    verdict = CompileVerdict(("GatedBlock",), True, "AcceleratorError in fused::gated", run)
    from reprocut.report.compiled import compile_markdown

    assert not any("Inductor-generated kernel" in line for line in compile_markdown(verdict))
    # the same traceback from the CPU, where a generated kernel raises its own error: named
    cpu = output.replace("triton_poi_fused_gelu_0.run(buf3, buf4, 33554432, stream=stream0)",
                         "cpp_fused_gelu_0(buf3, buf4)").split("torch.AcceleratorError")[0]  # fmt: skip
    named = read_compiled(cpu + "RuntimeError: index out of bounds: 0 <= tmp2 < 64L\n", 1, 1.0)
    assert named.kernel == "cpp_fused_gelu_0"


def test_an_abort_without_traceback_is_a_crash_with_the_kernels_assertion() -> None:
    """Inductor's CPU kernel under OpenMP: a C++ exception ends the process (SIGABRT)."""
    output = (
        "terminate called after throwing an instance of 'c10::Error'\n"
        "  what():  index out of bounds: 0 <= tmp4 < 2048\n"
    )
    run = read_compiled(output, -6, 1.0)
    assert run.failed and run.crashed and run.error_type is None
    assert run.assertion == "index out of bounds: 0 <= tmp4 < 2048"
    assert "signal 6" in run.describe() and "terminate called" in run.message


def test_candidates_call_what_was_compiled_through_the_public_api() -> None:
    code = (
        "import torch\n\n"
        "@torch.compile\ndef stats(x):\n    return x.sum()\n\n"
        "def plain(x):\n    return x\n\n"
        "fast = torch.compile(plain, dynamic=False)\n\n"
        "class Net(torch.nn.Module):\n    def forward(self, x):\n        return x\n\n"
        "def main():\n    stats(torch.ones(2))\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    ids = TensorSpec((3,), dtype="int64", values=Literal((1, 2, 70)))
    floats = TensorSpec((2, 4), dtype="float32", values=Generated("randn"))
    (decorated,) = compiled_call_candidates(code, "stats", (ids,))
    assert decorated.rstrip().endswith("stats(torch.tensor((1, 2, 70)).reshape((3,)))")
    assert "def main" not in decorated and "__main__" not in decorated  # no loop, no guard
    bound = compiled_call_candidates(code, "plain", (floats,))
    assert any(c.rstrip().startswith("import torch") and "\nfast(torch.randn" in c for c in bound)
    assert any("torch.compile(plain)(" in c for c in bound)
    (module,) = compiled_call_candidates(code, "Net", (floats,))
    assert "torch.compile(Net())(torch.randn((2, 4)" in module
    for candidate in (decorated, *bound, module):
        compile(candidate, "candidate", "exec")
    assert compiled_call_candidates(code, "stats", (None,)) == []


def test_the_verdict_round_trips_through_json() -> None:
    verdict = CompileVerdict(("TinyLM",), True, "IndexError in aten::embedding at train.py:24",
                             read_compiled("RuntimeError: x\n", 1, 2.0), {"fallback_random": "True"},
                             {"torch": "2.13"}, {"TinyLM": (None,)})  # fmt: skip
    assert CompileVerdict.from_json(json.loads(json.dumps(verdict.to_json()))) == verdict
    assert verdict.to_json()["used"] is True


def test_a_compiled_model_that_fails_eagerly_too_gets_the_eager_repro(tmp_path: Path) -> None:
    truth = _truth("compile_embedding_vocab")["verdict"]
    report, code = _record("compile_embedding_vocab", tmp_path, "--shrink")
    assert code == 0, report
    verdict = report["torch_compile"]
    assert verdict["used"] and verdict["fails_eagerly"] is truth["fails_eagerly"]
    assert verdict["compiled"] == [truth["compiled"]]
    compiled = verdict["compiled_run"]
    cpu = truth["cpu"]
    assert compiled["failed"]
    # a C++ exception from the Inductor kernel: raised, or an abort when OpenMP threads ran it
    assert compiled["error_type"] == cpu["compiled_error_type"] or compiled["crashed"]
    assert cpu["assertion"] in (verdict["assertion"] or "")
    if not compiled["crashed"]:
        assert verdict["kernel"].startswith(cpu["kernel_prefix"])
    assert report["op"] == truth["op"] and report["step"] == truth["step"]
    assert report["source"]["line"] == _marker_line(CASES / "compile_embedding_vocab" / "train.py")
    assert report["error"]["type"] == cpu["eager_error_type"]
    shrink = report["shrink"]
    assert shrink["status"] == "verified", shrink
    repro = Path(shrink["repro"])
    assert "torch.compile" not in repro.read_text()  # the compiler is not involved
    markdown = Path(shrink["report"]).read_text()
    assert "fails eagerly too: the compiler is not involved" in markdown


@pytest.mark.slow  # two compiles per candidate: about 100 s on 2 busy cores
def test_a_failure_only_under_compile_gets_a_verified_compiled_repro(tmp_path: Path) -> None:
    truth = _truth("compile_custom_op_fake_shape")["verdict"]
    report, code = _record("compile_custom_op_fake_shape", tmp_path)
    assert code == 0, report
    assert report["status"] == "compile-only"
    verdict = report["torch_compile"]
    assert verdict["fails_eagerly"] is False and verdict["compiled"] == [truth["compiled"]]
    assert report["error"]["type"] == truth["error_type"]
    assert report["signature"]["kind"] == truth["kind"]
    assert report["source"]["file"].endswith(truth["file"])
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "shrink", "--json", "--root", str(tmp_path),
         "--max-time", "20"],
        cwd=CASES / "compile_custom_op_fake_shape", capture_output=True, text=True, timeout=900,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    shrunk = json.loads(done.stdout)
    assert shrunk["status"] == "verified" and shrunk["compile_only"]["eager_passes"]
    repro = Path(shrunk["repro"])
    code_text = repro.read_text()
    assert "torch.compile" in code_text and "for step in" not in code_text  # one call, no loop
    assert f"{truth['function']}(torch." in code_text
    compiled_run, eager_run = _run(repro, compiled=True), _run(repro, compiled=False)
    assert "AssertionError: expected size 7==8" in compiled_run.stderr
    assert eager_run.returncode == 0, eager_run.stderr[-2000:]
    markdown = Path(shrunk["report"]).read_text()
    assert "likely a compiler bug" in markdown and "torch._inductor.config" in markdown


def test_no_compiled_run_keeps_the_eager_note(tmp_path: Path) -> None:
    report, code = _record("compile_embedding_vocab", tmp_path, "--no-compiled-run")
    assert code == 0
    assert report["torch_compile"]["fails_eagerly"] is None
    assert report["torch_compile"]["compiled_run"] is None


@pytest.mark.cuda
def test_on_a_gpu_the_compiled_model_device_asserts_in_a_triton_kernel(tmp_path: Path) -> None:
    """benchmarks/gpu_batch.sh stage `compile`: the Inductor kernel's device-side assert, the
    verdict and the eager repro verified; REPROCUT_COMPILE_OUT names the result file."""
    import platform
    import time

    import torch

    truth = _truth("compile_embedding_vocab")["verdict"]
    started = time.monotonic()
    report, code = _record("compile_embedding_vocab", tmp_path, "--shrink", device="cuda")
    seconds = time.monotonic() - started
    out = os.environ.get("REPROCUT_COMPILE_OUT")
    if out:
        Path(out).write_text(json.dumps({
            "case": "corpus/compile/compile_embedding_vocab",
            "command": "reprocut record --json --quiet --shrink train.py --device cuda",
            "seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%d"),
            "machine": platform.node(), "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "exit_code": code,
            "torch_compile": report.get("torch_compile"), "op": report.get("op"),
            "step": report.get("step"), "shrink": report.get("shrink"),
        }, indent=1))  # fmt: skip
    assert code == 0, report
    verdict = report["torch_compile"]
    assert verdict["fails_eagerly"] is True
    assert truth["cuda"]["assertion"] in (verdict["assertion"] or "")
    assert (verdict["kernel"] or "").startswith(truth["cuda"]["kernel_prefix"])
    assert report["op"] == truth["op"] and report["step"] == truth["step"]
    assert report["shrink"]["status"] == "verified"


def test_a_triton_assert_without_its_kernels_name_is_named_from_the_generated_file(
    tmp_path: Path,
) -> None:
    """Triton prints `unknown` where the kernel's name would stand (as on the H200 with torch
    2.11); the generated file the assert names holds the `def` that encloses its line."""
    cache = tmp_path / "torchinductor_root" / "ro"
    cache.mkdir(parents=True)
    generated = cache / "crorn.py"
    generated.write_text(
        "import triton\n\n@triton.jit\ndef triton_poi_fused_embedding_0(in_ptr0, out_ptr0, xnumel):\n"
        "    tmp4 = tl.load(in_ptr0)\n    tl.device_assert(tmp4 < 64)\n\n"
        "@triton.jit\ndef triton_per_fused_mean_1(in_ptr0):\n    pass\n"
    )
    output = (
        f"{generated}:6: unknown: block: [3,0,0], thread: [0,0,0] Assertion `index out of "
        "bounds: 0 <= tmp4 < 64` failed.\nTraceback (most recent call last):\n"
        '  File "/tmp/torchinductor_root/cd/ccd34.py", line 80, in call\n'
        "    triton_per_fused_mean_1.run(buf2, buf3)\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
    )
    kernel, assertion, kernel_file = inductor_evidence(output)
    assert kernel == "triton_poi_fused_embedding_0"
    assert assertion == "index out of bounds: 0 <= tmp4 < 64"
    assert kernel_file == str(generated)
