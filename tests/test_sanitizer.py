"""compute-sanitizer memcheck: its report parsed (fixtures in the formats memcheck prints, old and
new), addresses named by the repro's tensors, the tensor-map wrapper, the docstring it writes,
the note when there is no sanitizer; and (cuda) a real memcheck run on a faulting repro."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprocut.check import sanitizer
from reprocut.check.memcheck import TensorRange, describe, human_bytes, parse_report, useful_frames
from reprocut.check.sanitizer import (
    annotate,
    argument_positions,
    findings_of,
    run_memcheck,
)

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 1 << 30


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_new_format_report_with_api_error_and_print_limit() -> None:
    report = parse_report(fixture("memcheck_triton_oob.log"))
    assert report.summary == 128 and len(report.errors) == 3
    first = report.first_access
    assert first is not None
    assert (first.access, first.size, first.space) == ("read", 4, "__global__")
    assert first.kernel == "add_cond_kernel"
    assert (first.thread, first.block) == ((96, 0, 0), (3, 0, 0))
    assert first.address == 0x7F2A3C00C180 and first.problem == "out of bounds"
    assert first.nearest == ("after", 48768, 0x7F2A3C000200, 512)
    assert useful_frames(first.host_frames) == ["[cuda_utils.cpython-312-x86_64-linux-gnu.so]"]
    api = report.errors[2]
    assert api.api_error == ("cudaErrorLaunchFailure", 719, "unspecified launch failure")
    assert useful_frames(api.host_frames) == ["c10::cuda::device_synchronize"]


def test_old_format_report_keeps_the_templated_kernel_and_the_aten_frames() -> None:
    (error,) = parse_report(fixture("memcheck_index_select_old.log")).errors
    assert error.kernel is not None and error.kernel.startswith(
        "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long"
    )
    assert error.size == 4 and error.address == 0x7F0A50000000
    assert useful_frames(error.host_frames) == [
        "at::native::index_select_out_cuda_impl",
        "at::native::embedding_symint",
    ]


def test_misaligned_access_and_a_frame_whose_module_is_on_the_next_line() -> None:
    (error,) = parse_report(fixture("memcheck_misaligned.log")).errors
    assert (error.kernel, error.size, error.problem) == ("cmvn_vec4", 16, "misaligned")
    assert error.host_frames[-1].endswith("in function.cpython-312-x86_64-linux-gnu.so")
    assert useful_frames(error.host_frames) == ["cupy.cuda.function.Function.__call__"]


def test_addresses_are_named_by_the_nearest_tensor() -> None:
    (error,) = parse_report(fixture("memcheck_index_select_old.log")).errors
    start = error.address + int(3.5 * GIB)  # the access lands 3.5 GiB below the table
    table = TensorRange("weight", start, 4096, start, position=1)
    ids = TensorRange("ids", start + 8 * GIB, 8, start + 8 * GIB, position=0)
    assert (
        describe(error, [table, ids]) == "reads 4 B at 3.5 GiB before the start of `weight` (arg 1)"
    )
    after = TensorRange("x", error.address - 512, 256, error.address - 512)
    assert describe(error, [after]) == "reads 4 B at 256 B after the end of `x`"
    inside = TensorRange("out", error.address - 64, 1024, error.address - 64, position="out")
    assert describe(error, [inside]) == (
        "reads 4 B 64 B into the 1.0 KiB storage of `out` (keyword out)"
    )
    assert human_bytes(3) == "3 B" and human_bytes(int(1.5 * 1024)) == "1.5 KiB"


def test_findings_are_a_few_lines_in_words() -> None:
    report = parse_report(fixture("memcheck_triton_oob.log"))
    cond = TensorRange("c_ptr", 0x7F2A3C000200, 512, 0x7F2A3C000200, position=1)
    lines = findings_of(report, [cond])
    assert lines[0] == "Invalid __global__ read of size 4 bytes in add_cond_kernel"
    assert lines[1] == (
        "thread (96,0,0) in block (3,0,0): reads 4 B at 47.4 KiB after the end of `c_ptr` (arg 1)"
    )
    assert lines[-1] == "128 error(s) in all"


def test_argument_positions_of_a_call_and_of_a_kernel_launch() -> None:
    emitted = (
        "def main():\n    x = 1\n    torch.gather(x, 0, index=ids)\n    torch.cuda.synchronize()\n"
    )
    assert argument_positions(emitted) == {"x": 0, "ids": "index"}
    launch = "add_cond_kernel[grid](x, cond, out, n, BLOCK=1024)\ntorch.cuda.synchronize()\n"
    assert argument_positions(launch) == {"x": 0, "cond": 1, "out": 2, "n": 3}


def test_annotate_writes_into_the_docstring_and_replaces_an_old_section() -> None:
    code = '"""Minimal reproduction.\n\nRun: python repro.py\n"""\n\nimport torch\n'
    once = annotate(code, ["compute-sanitizer (memcheck):", "  reads 4 B"])
    assert once.startswith('"""Minimal reproduction.\n\nRun: python repro.py\n\ncompute-sanitizer')
    twice = annotate(once, ["compute-sanitizer (memcheck):", "  writes 8 B"])
    assert "reads 4 B" not in twice and "writes 8 B" in twice and twice.count("memcheck") == 1
    assert "import torch" in twice
    compile(twice, "repro.py", "exec")
    bare = annotate("\nimport torch\n", ["compute-sanitizer (memcheck): clean"])
    assert bare.startswith('"""compute-sanitizer') and bare.endswith("import torch\n")


def test_without_compute_sanitizer_there_is_a_note_and_nothing_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sanitizer, "FALLBACK", tmp_path / "missing")
    script = tmp_path / "repro.py"
    script.write_text("import torch\n")
    evidence = run_memcheck(script)
    assert evidence.status == "unavailable" and "not on PATH" in evidence.note
    assert evidence.header_lines() == [f"compute-sanitizer (memcheck): {evidence.note}"]


STAND_IN = """\
#!{python}
# Runs the program as compute-sanitizer would (its options dropped), then writes a memcheck
# error whose address lies 3.5 GiB after the end of the highest tensor the wrapper mapped (so that
# tensor is the nearest whatever the allocator's layout; before the lowest one the address can be
# negative: a Python built without PIE, as Ubuntu's, has its heap near address 0), and that
# tensor's name to $STAND_IN_NAMED.
import json, os, subprocess, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
program = args[args.index("--log-file") + 2:]
subprocess.run(program)
highest = max(json.load(open(os.environ["REPROCUT_TENSOR_MAP"])),
              key=lambda t: t["storage_ptr"] + t["storage_bytes"])
address = highest["storage_ptr"] + highest["storage_bytes"] + int(3.5 * 2**30)
open(os.environ["STAND_IN_NAMED"], "w").write(highest["name"])
assert os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
open(log, "w").write(
    "========= Invalid __global__ read of size 4 bytes\\n"
    "=========     at gather_kernel+0x40\\n"
    "=========     by thread (3,0,0) in block (1,0,0)\\n"
    f"=========     Access at {{hex(address)}} is out of bounds\\n"
    "========= ERROR SUMMARY: 1 error\\n"
)
"""


def stand_in(folder: Path, text: str) -> Path:
    """An executable `compute-sanitizer` in `folder` that runs `text` with this python."""
    tool = folder / "compute-sanitizer"
    tool.write_text(text.format(python=sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return tool


def test_the_wrapper_maps_the_repros_tensors_and_names_the_address(tmp_path, monkeypatch) -> None:
    """The plumbing around memcheck, run for real except memcheck itself (absent here): a
    stand-in runs the program as the sanitizer would and reports one access."""
    tool = stand_in(tmp_path, STAND_IN)
    script = tmp_path / "repro.py"
    script.write_text(
        '"""Minimal reproduction."""\nimport torch\n\n\ndef main():\n'
        "    table = torch.zeros(8, 4)\n    ids = torch.tensor([1])\n"
        "    torch.index_select(table, 0, ids)\n\n\nmain()\n"
    )
    monkeypatch.setenv("STAND_IN_NAMED", str(tmp_path / "named.txt"))
    evidence = run_memcheck(script, sanitizer=str(tool), timeout=120)
    assert evidence.status == "found", evidence
    name = (tmp_path / "named.txt").read_text()
    arg = {"table": 0, "ids": 2}[name]  # torch.index_select(table, 0, ids)
    assert evidence.findings[1] == (
        f"thread (3,0,0) in block (1,0,0): reads 4 B at 3.5 GiB after the end of `{name}` "
        f"(arg {arg})"
    )
    assert Path(evidence.log).read_text().startswith("========= Invalid __global__ read")
    assert json.loads(json.dumps(evidence.to_json()))["errors"][0]["kernel"] == "gather_kernel"


def test_the_tensor_map_survives_a_process_that_dies_inside_the_failing_call(tmp_path, monkeypatch):
    """cuSPARSE's fault under memcheck ends the process inside `torch.sparse.mm` (its workspace's
    cudaFree fails), so no script frame returns: the map is written before each call instead."""
    tool = stand_in(tmp_path, STAND_IN)
    script = tmp_path / "repro.py"
    script.write_text(
        "import os\nimport torch\n\n\ndef main():\n"
        "    table = torch.zeros(8, 4)\n    ids = torch.tensor([1])\n"
        "    torch.index_select(table, 0, ids)\n    os.abort()\n\n\nmain()\n"
    )
    monkeypatch.setenv("STAND_IN_NAMED", str(tmp_path / "named.txt"))
    evidence = run_memcheck(script, sanitizer=str(tool), timeout=120)
    assert evidence.status == "found", evidence
    name = (tmp_path / "named.txt").read_text()
    assert name in ("table", "ids")
    assert f"after the end of `{name}`" in evidence.findings[1]


FILTER_STAND_IN = """\
#!{python}
# memcheck's stand-in for the kernel filter: it logs its options; given --kernel-name it reports
# what memcheck reports when the faulting kernel is not among those instrumented (the program
# hits the error on an API call, no access is attributed), else one access error.
import os, subprocess, sys
args = sys.argv[1:]
open(os.environ["STAND_IN_CALLS"], "a").write(" ".join(args[:args.index("--log-file")]) + "\\n")
log = args[args.index("--log-file") + 1]
subprocess.run(args[args.index("--log-file") + 2:])
filtered = "--kernel-name" in args and os.environ.get("STAND_IN_MISS") == "1"
open(log, "w").write(
    "========= Program hit cudaErrorIllegalAddress (error 700) due to \\"an illegal memory "
    "access was encountered\\" on CUDA API call to cudaStreamSynchronize.\\n"
    if filtered else
    "========= Invalid __global__ read of size 4 bytes\\n"
    "=========     at gather_kernel+0x40\\n"
    "=========     by thread (3,0,0) in block (1,0,0)\\n"
    "=========     Access at 0x10 is out of bounds\\n"
)
"""


@pytest.mark.parametrize("miss", [False, True])
def test_a_known_kernel_is_checked_alone_and_everything_when_that_finds_no_access(
    tmp_path, monkeypatch, miss
):
    tool = stand_in(tmp_path, FILTER_STAND_IN)
    script = tmp_path / "repro.py"
    script.write_text("import torch\n\nx = torch.zeros(4)\n")
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("STAND_IN_CALLS", str(calls))
    monkeypatch.setenv("STAND_IN_MISS", "1" if miss else "0")
    evidence = run_memcheck(script, sanitizer=str(tool), timeout=120, kernel="gather_kernel")
    runs = calls.read_text().splitlines()
    assert "--kernel-name kns=gather_kernel" in runs[0] and "--padding 65536" in runs[0]
    assert evidence.report.first_access is not None and "gather_kernel" in evidence.findings[0]
    if miss:  # the filtered run attributed nothing: every kernel is checked once more
        assert len(runs) == 2 and "--kernel-name" not in runs[1]
        assert evidence.kernel_filter is None
    else:
        assert len(runs) == 1 and evidence.kernel_filter == "gather_kernel"
        assert "kernels named like `gather_kernel`" in evidence.markdown()
    assert evidence.to_json()["kernel_filter"] == evidence.kernel_filter


# a column id 2**30 past the size: cuSPARSE reads far outside every allocation
SPARSE_FAULT = (
    "import torch\n\n\ndef main():\n"
    '    indices = torch.tensor([[0], [2**30]], device="cuda")\n'
    '    values = torch.ones(1, device="cuda")\n'
    "    adj = torch.sparse_coo_tensor(indices, values, (4, 4), check_invariants=False)\n"
    '    x = torch.randn(4, 8, device="cuda")\n'
    "    torch.sparse.mm(adj, x)\n    torch.cuda.synchronize()\n\n\nmain()\n"
)


@pytest.mark.cuda
def test_memcheck_on_a_real_out_of_bounds_sparse_repro(tmp_path) -> None:
    """On a GPU with compute-sanitizer: a column id 2**30 past the size sends cuSPARSE far
    outside every allocation; memcheck reports the access and its kernel."""
    if sanitizer.find_sanitizer() is None:
        pytest.skip("compute-sanitizer is not installed")
    script = tmp_path / "repro.py"
    script.write_text(SPARSE_FAULT)
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})  # fmt: skip
    assert plain.returncode != 0
    evidence = run_memcheck(script, timeout=300)
    assert evidence.status == "found", evidence.to_json()
    first = evidence.report.first_access
    assert first is not None and first.kernel and first.address is not None
    assert any(
        "`x`" in line or "`values`" in line or "`indices`" in line for line in evidence.findings
    ), evidence.to_json()  # the findings and the tensor map, to see why none was named


def test_the_address_follows_from_the_nearest_allocation_when_no_address_line_was_read() -> None:
    """Real reports (NVIDIA/cuvs#1231, ORNL/HeCBench#132), their address lines left out: the
    address computed from the nearest allocation is the one the address line gave."""
    for address, nearest in (
        ("0x769431db3800", "593,361,581,569 bytes after the nearest allocation at 0x760a0ac00000 of size 512 bytes"),
        ("0x7f698ba00144", "1 bytes after the nearest allocation at 0x7f698ba00000 of size 324 bytes"),
    ):  # fmt: skip
        report = parse_report(
            "========= Invalid __global__ read of size 4 bytes\n"
            "=========     at col_kernel(const unsigned int *, unsigned int *)+0x490\n"
            "=========     by thread (1,0,0) in block (0,0,0)\n"
            f"=========     and is {nearest}\n"
            "========= \n"
            "========= ERROR SUMMARY: 1 error\n"
        )
        assert report.first_access is not None
        assert report.first_access.address == int(address, 16)


LINGERING_STAND_IN = """\
#!{python}
# memcheck's stand-in for a kernel with more errors than it prints: the printed ones are in the
# log at once, then it goes on counting (here: sleeping) and leaves $STAND_IN_DONE at the end.
import os, sys, time
args = sys.argv[1:]
limit = int(args[args.index("--print-limit") + 1])
log = open(args[args.index("--log-file") + 1], "w")
for thread in range(limit):
    log.write(
        "========= Invalid __global__ read of size 4 bytes\\n"
        "=========     at gather_kernel+0x40\\n"
        f"=========     by thread ({{thread}},0,0) in block (1,0,0)\\n"
        "=========     Access at 0x10 is out of bounds\\n"
        "=========\\n"
    )
log.flush()
time.sleep(float(os.environ["STAND_IN_LINGER"]))
open(os.environ["STAND_IN_DONE"], "w").write("counted them all")
log.write("========= ERROR SUMMARY: 237795 errors\\n")
"""


def test_memcheck_is_stopped_once_it_has_printed_all_it_will(tmp_path, monkeypatch) -> None:
    """After `--print-limit` errors memcheck prints nothing more, however long it goes on
    counting (most of its time on a 1 GB kernel): reprocut stops it there."""
    tool = stand_in(tmp_path, LINGERING_STAND_IN)
    script = tmp_path / "repro.py"
    script.write_text("import torch\n")
    done = tmp_path / "done.txt"
    monkeypatch.setenv("STAND_IN_DONE", str(done))
    monkeypatch.setenv("STAND_IN_LINGER", "300")
    evidence = run_memcheck(script, sanitizer=str(tool), timeout=240)
    assert not done.exists()  # stopped, not waited for (nor killed at the timeout)
    assert evidence.status == "found" and evidence.stopped_early
    assert len(evidence.report.errors) == sanitizer.PRINT_LIMIT
    assert evidence.findings[-1] == (
        f"at least {sanitizer.PRINT_LIMIT} errors (memcheck stopped after printing them)"
    )
    assert evidence.to_json()["stopped_early"] is True


def test_memcheck_that_ends_on_its_own_keeps_its_total(tmp_path, monkeypatch) -> None:
    tool = stand_in(tmp_path, LINGERING_STAND_IN)
    script = tmp_path / "repro.py"
    script.write_text("import torch\n")
    monkeypatch.setenv("STAND_IN_DONE", str(tmp_path / "done.txt"))
    monkeypatch.setenv("STAND_IN_LINGER", "0")
    evidence = run_memcheck(script, sanitizer=str(tool), timeout=240)
    assert evidence.status == "found" and not evidence.stopped_early
    assert evidence.findings[-1] == "237795 error(s) in all"


def test_a_script_reductions_original_memcheck_starts_with_the_reduction(
    tmp_path, monkeypatch
) -> None:
    """The user's script under memcheck, from its own folder with its own arguments, begun
    before any candidate exists; its report kept as sanitizer-original.log in the output."""
    from reprocut.model.case import Signature
    from reprocut.model.recording import ErrorInfo, Failure
    from reprocut.pipeline.same_bug import ORIGINAL_LOG, start_script_memcheck

    stand_in(tmp_path, STAND_IN)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STAND_IN_NAMED", str(tmp_path / "named.txt"))
    folder = tmp_path / "project"
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(
        "import sys\nimport torch\nassert sys.argv[1:] == ['--steps', '2']\n"
        "table = torch.zeros(8, 4)\n"
    )
    fault = Signature("AcceleratorError", None, 700, "an illegal memory access was encountered")
    failure = Failure("outside-dispatcher", ErrorInfo("AcceleratorError", fault.kind), fault,
                      kernel="gather_kernel", device="cuda:0", script=str(script),
                      argv=("--steps", "2"), cwd=str(folder))  # fmt: skip
    out = tmp_path / "out"
    started = start_script_memcheck(out, failure, timeout=120)
    assert started is not None
    evidence = started.result(timeout=120)
    assert evidence.status == "found", evidence  # the stand-in ran the script, its asserts held
    assert (out / ORIGINAL_LOG).read_text().startswith("========= Invalid __global__ read")
    # not a memory fault on the GPU: nothing to start
    cpu = Failure("localized", failure.error, fault, device="cpu", script=str(script))
    assert start_script_memcheck(out, cpu, timeout=120) is None
    other = Signature("RuntimeError", "aten::mm", None, "shape mismatch")
    assert start_script_memcheck(out, Failure("localized", failure.error, other,
                                              device="cuda:0", script=str(script)),
                                 timeout=120) is None  # fmt: skip


def test_a_captured_calls_original_memcheck_starts_once_the_shrink_logs_it(
    tmp_path, monkeypatch
) -> None:
    """An op-level shrink's unshrunk case goes under memcheck as soon as it is logged, beside
    the reduction, not at the verification; nothing starts before, nor for a later entry."""
    from reprocut.model.case import ReproCase, Signature, TensorSpec
    from reprocut.model.recording import ErrorInfo, Failure
    from reprocut.pipeline.same_bug import (
        ORIGINAL_LOG,
        start_case_memcheck,
        start_original_memcheck,
    )
    from reprocut.shrink.walkback import AcceptedLog

    stand_in(tmp_path, STAND_IN)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STAND_IN_NAMED", str(tmp_path / "named.txt"))
    fault = Signature("AcceleratorError", None, 700, "an illegal memory access was encountered")
    failure = Failure("localized", ErrorInfo("AcceleratorError", fault.kind), fault,
                      kernel="gather_kernel", device="cuda:0")  # fmt: skip
    out, log = tmp_path / "out", AcceptedLog(tmp_path / "accepted")
    rendered = []

    def render(case, inputs):
        rendered.append(case)
        return "import torch\ntable = torch.zeros(8, 4)\n", []

    started = start_case_memcheck(out, log, failure, render, {}, timeout=120)
    assert started is not None and not (started.running() or started.done())
    repro = tmp_path / "repro.py"
    repro.write_text("import torch\nx = torch.zeros(2, device='cuda')\n")
    # not begun yet (nothing logged): the verification would start its own
    assert start_original_memcheck(None, repro, failure, log, source=False, render=render,
                                   inputs={}, timeout=120, started_case=started) is None  # fmt: skip
    case = ReproCase("torch.gather", (TensorSpec((8, 4)),))
    log.add_case(case)
    assert started.running() or started.done()
    log.add_case(ReproCase("torch.gather", (TensorSpec((2, 4)),)))  # a later one starts nothing
    assert start_original_memcheck(None, repro, failure, log, source=False, render=render,
                                   inputs={}, timeout=120, started_case=started) is started  # fmt: skip
    evidence = started.result(timeout=120)
    assert evidence.status == "found", evidence
    assert rendered == [case]
    assert (out / ORIGINAL_LOG).read_text().startswith("========= Invalid __global__ read")
    # the op-level path declined before logging a case: the user's script is not memchecked
    # here (the verification runs its memcheck from its folder with its arguments)
    declined = AcceptedLog(tmp_path / "declined")
    pending = start_case_memcheck(out, declined, failure, render, {}, timeout=120)
    declined.start_source("import torch\n")
    assert pending is not None and not (pending.running() or pending.done())
    cpu = Failure("localized", failure.error, fault, device="cpu")
    assert start_case_memcheck(out, AcceptedLog(tmp_path / "cpu"), cpu, render, {},
                               timeout=120) is None  # fmt: skip


# a repro as a script reduction writes it: docstring, `import torch` first; it notes who ran it
# (its parent: the sanitizer's pid) and what it saw, and hands index_select one named tensor
RECORDING_REPRO = '''"""Reduced from train.py."""

import torch
import json, os, sys
from pathlib import Path

seen = [os.getppid(), sys.argv, os.getcwd(), sys.path[0], __name__, __file__]
with open(Path(__file__).with_name("ran.jsonl"), "a") as ran:
    ran.write(json.dumps(seen) + "\\n")


def main():
    table = torch.zeros(8, 4)
    torch.index_select(table, 0, torch.tensor([1]))


main()
'''


def _ran(script: Path) -> list[list]:
    """What each run of RECORDING_REPRO noted: [parent pid, argv, cwd, sys.path[0], ...]."""
    return [json.loads(line) for line in script.with_name("ran.jsonl").read_text().splitlines()]


def _gone(pid: int, within: float = 10.0) -> bool:
    """The process `pid` has ended (a zombie counts as ended) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_a_memcheck_started_ahead_gives_what_a_fresh_one_gives(tmp_path, monkeypatch) -> None:
    """A memcheck standby imports torch under the sanitizer first, then runs the repro it is
    handed: the same status, findings and tensor naming as a memcheck started afresh, the repro
    run by the standby's process, seeing the same arguments, folder and sys.path[0]."""
    from reprocut.check import check_log
    from reprocut.check.memcheck_process import MemcheckStandby

    tool = stand_in(tmp_path, STAND_IN)
    monkeypatch.setenv("STAND_IN_NAMED", str(tmp_path / "named.txt"))
    monkeypatch.setenv(check_log.LOG_ENV, str(tmp_path / "checks.jsonl"))
    out, project = tmp_path / "out", tmp_path / "project"
    out.mkdir()
    project.mkdir()
    script = out / "repro.py"
    script.write_text(RECORDING_REPRO)
    standby = MemcheckStandby(str(tool), kernel=None, cwd=out)
    try:
        fresh = run_memcheck(script, sanitizer=str(tool), timeout=120, argv=["-n", "2"],
                             cwd=project, log=tmp_path / "fresh.log")  # fmt: skip
        assert standby.fits(script, kernel=None)
        ahead = run_memcheck(script, sanitizer=str(tool), timeout=120, argv=["-n", "2"],
                             cwd=project, standby=standby)  # fmt: skip
        assert not standby.fits(script, kernel=None)  # used once
    finally:
        standby.close()
    assert fresh.status == ahead.status == "found", (fresh, ahead)
    assert ahead.findings == fresh.findings
    assert ahead.findings[1] == (
        "thread (3,0,0) in block (1,0,0): reads 4 B at 3.5 GiB after the end of `table` (arg 0)"
    )
    assert [t.name for t in ahead.tensors] == [t.name for t in fresh.tensors] == ["table"]
    assert Path(ahead.log) == script.with_name(sanitizer.LOG_NAME)
    assert Path(ahead.log).read_text().startswith("========= Invalid __global__ read")
    assert ahead.seconds > 0
    first, second = _ran(script)
    assert first[0] != standby.process.pid and second[0] == standby.process.pid  # ran ahead
    assert first[1:] == second[1:]  # argv, cwd, sys.path[0], __name__, __file__
    assert second[1:4] == [[str(script), "-n", "2"], str(project), str(out)]
    assert _gone(standby.process.pid) and not standby.files.folder.exists()
    logged = [json.loads(line) for line in (tmp_path / "checks.jsonl").read_text().splitlines()]
    assert [(line["kind"], line["standby"]) for line in logged] == [
        ("memcheck", False),
        ("memcheck", True),
    ]


PID_STAND_IN = """\
#!{python}
# memcheck's stand-in that notes its pid and its program's, then waits for the program.
import os, subprocess, sys
args = sys.argv[1:]
program = subprocess.Popen(args[args.index("--log-file") + 2:])
open(os.environ["STAND_IN_PIDS"], "a").write(f"{{os.getpid()}} {{program.pid}}\\n")
sys.exit(program.wait())
"""


def _pids(path: Path, within: float = 60.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return [int(pid) for pid in path.read_text().split()]
        time.sleep(0.1)
    raise AssertionError(f"the stand-in wrote no pids to {path}")


def test_a_memcheck_standby_never_handed_a_repro_ends_and_leaves_nothing(
    tmp_path, monkeypatch
) -> None:
    """Closed unused, the standby's whole process group is killed (the sanitizer and the python
    under it) and its folder removed; a standby whose stdin closes (reprocut gone without
    closing it) exits on its own, with status 0."""
    from reprocut.check import lifeline
    from reprocut.check.memcheck_process import MemcheckStandby

    tool = stand_in(tmp_path, PID_STAND_IN)
    monkeypatch.setenv("STAND_IN_PIDS", str(tmp_path / "closed.txt"))
    closed = MemcheckStandby(str(tool), kernel="gather_kernel", cwd=tmp_path)
    monkeypatch.setenv("STAND_IN_PIDS", str(tmp_path / "orphaned.txt"))
    orphaned = MemcheckStandby(str(tool), kernel="gather_kernel", cwd=tmp_path)
    sanitizer_pid, python_pid = _pids(tmp_path / "closed.txt")
    assert sanitizer_pid == closed.process.pid and closed.process.poll() is None
    assert closed.process.pid in lifeline._owned  # killed with reprocut, however it ends
    closed.close()
    closed.close()  # twice is fine
    assert _gone(sanitizer_pid) and _gone(python_pid)
    assert not closed.files.folder.exists()
    assert closed.process.pid not in lifeline._owned
    _pids(tmp_path / "orphaned.txt")
    assert orphaned.process.stdin is not None
    orphaned.process.stdin.close()  # what reprocut's end does to the pipe
    assert orphaned.process.wait(timeout=120) == 0
    orphaned.close()
    assert not orphaned.files.folder.exists()


def test_the_memcheck_ahead_starts_only_when_asked_for(tmp_path, monkeypatch) -> None:
    """Off by default (on the H200 three of six hung to their timeout, faults-cuda.md):
    REPROCUT_MEMCHECK_AHEAD=1 starts it, for a memory fault on the GPU only."""
    from reprocut.model.case import Signature
    from reprocut.model.recording import ErrorInfo, Failure
    from reprocut.pipeline import ahead

    stand_in(tmp_path, PID_STAND_IN)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STAND_IN_PIDS", str(tmp_path / "pids.txt"))
    monkeypatch.setattr(ahead, "has_cores_to_warm", lambda: True)  # the H200's 16 cores
    fault = Signature("AcceleratorError", None, 700, "an illegal memory access was encountered")
    failure = Failure("localized", ErrorInfo("AcceleratorError", fault.kind), fault,
                      kernel="gather_kernel", device="cuda:0")  # fmt: skip
    monkeypatch.delenv(ahead.MEMCHECK_AHEAD_ENV, raising=False)
    assert ahead.warm_memcheck(failure, tmp_path) is None
    monkeypatch.setenv(ahead.MEMCHECK_AHEAD_ENV, "1")
    started = ahead.warm_memcheck(failure, tmp_path)
    assert started is not None
    try:
        assert started.process.poll() is None and started.kernel == "gather_kernel"
    finally:
        started.close()
    on_cpu = Failure("localized", failure.error, fault, device="cpu")
    assert ahead.warm_memcheck(on_cpu, tmp_path) is None


@pytest.mark.parametrize(
    ("first_line", "standby_kernel", "in_standby"),
    [
        ("import torch", "gather_kernel", True),
        ("import os", "gather_kernel", False),  # may set the environment before torch
        ("import torch", None, False),  # the standby checks every kernel, this memcheck one
    ],
)
def test_the_repros_memcheck_runs_in_the_standby_only_if_that_is_the_same_run(
    tmp_path, monkeypatch, first_line, standby_kernel, in_standby
) -> None:
    """start_memcheck hands repro.py to the standby when its first statement is `import torch`
    and the standby filters the kernels this memcheck would; else memcheck starts afresh and
    the standby is ended at once."""
    from concurrent.futures import ThreadPoolExecutor

    from reprocut.check.memcheck_process import MemcheckStandby
    from reprocut.model.case import Signature
    from reprocut.model.recording import ErrorInfo, Failure
    from reprocut.pipeline.recover import start_memcheck

    tool = stand_in(tmp_path, FILTER_STAND_IN)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STAND_IN_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.setenv("STAND_IN_MISS", "0")
    fault = Signature("AcceleratorError", None, 700, "an illegal memory access was encountered")
    failure = Failure("localized", ErrorInfo("AcceleratorError", fault.kind), fault,
                      kernel="gather_kernel", device="cuda:0")  # fmt: skip
    script = tmp_path / "repro.py"
    script.write_text(RECORDING_REPRO.replace("import torch\n", f"{first_line}\nimport torch\n", 1)
                      + "# device='cuda' in the real one\n")  # fmt: skip
    standby = MemcheckStandby(str(tool), kernel=standby_kernel, cwd=tmp_path)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = start_memcheck(pool, script, failure, timeout=120, standby=standby)
            assert future is not None
            evidence = future.result(timeout=240)
    finally:
        standby.close()
    assert evidence.status == "found" and evidence.kernel_filter == "gather_kernel", evidence
    ((parent, *_),) = _ran(script)
    assert (parent == standby.process.pid) is in_standby
    assert _gone(standby.process.pid) and not standby.files.folder.exists()


def test_a_standbys_filtered_memcheck_that_finds_no_access_is_followed_by_a_fresh_one(
    tmp_path, monkeypatch
) -> None:
    """The kernel-filtered run in the standby attributes no access: memcheck runs again over
    every kernel, in a process started then (the standby is single-use)."""
    from reprocut.check.memcheck_process import MemcheckStandby

    tool = stand_in(tmp_path, FILTER_STAND_IN)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("STAND_IN_CALLS", str(calls))
    monkeypatch.setenv("STAND_IN_MISS", "1")
    script = tmp_path / "repro.py"
    script.write_text(RECORDING_REPRO)
    standby = MemcheckStandby(str(tool), kernel="gather_kernel", cwd=tmp_path)
    try:
        evidence = run_memcheck(script, sanitizer=str(tool), timeout=120, kernel="gather_kernel",
                                standby=standby)  # fmt: skip
    finally:
        standby.close()
    runs = calls.read_text().splitlines()
    assert len(runs) == 2 and "--kernel-name kns=gather_kernel" in runs[0]
    assert "--kernel-name" not in runs[1]
    assert evidence.kernel_filter is None and "gather_kernel" in evidence.findings[0]
    ahead, fresh = (parent for parent, *_ in _ran(script))
    assert ahead == standby.process.pid and fresh != standby.process.pid
