"""Out of memory: recognized as its own class, the request explained from the op's inputs, the
growth and leak of `record --memory` with the variable that keeps it alive, a backward OOM at
its forward line, and the corpus cases under corpus/memory/ against their case.toml."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch

from reprocut.localize.memory import fragmentation
from reprocut.localize.oom_why import explain_request
from reprocut.model.case import ReproCase, TensorSpec
from reprocut.model.memory import Holder, Leak, MemoryReport, StepMemory
from reprocut.model.oom import (
    device_figures,
    is_out_of_memory,
    library_blocks,
    requested_bytes,
    snapshot_free_blocks,
)
from reprocut.model.signature import classify
from reprocut.report.memory_plot import render_svg
from reprocut.shrink.emitter import emit
from reprocut.shrink.empty_inputs import empty_case, public_target

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "corpus" / "memory"
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 232.83 GiB. GPU 0 has a total capacity of 139.81 GiB "
    "of which 137.52 GiB is free. Including non-PyTorch memory, this process has 2.28 GiB memory "
    "in use. Of the allocated memory 1.75 GiB is allocated by PyTorch, and 12.00 MiB is reserved "
    "by PyTorch but unallocated."
)


def test_every_kind_of_oom_is_recognized_with_one_signature_kind():
    assert is_out_of_memory("OutOfMemoryError", CUDA_OOM)
    assert is_out_of_memory("RuntimeError", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling")
    assert is_out_of_memory("RuntimeError", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED")
    assert is_out_of_memory("RuntimeError", "transform: cudaErrorMemoryAllocation")
    assert not is_out_of_memory("IndexError", "index out of range in self")
    assert requested_bytes(CUDA_OOM) == int(232.83 * (1 << 30))
    assert device_figures(CUDA_OOM) == (int(139.81 * (1 << 30)), int(137.52 * (1 << 30)))
    small = CUDA_OOM.replace("232.83 GiB", "20.00 MiB")
    assert classify("OutOfMemoryError", CUDA_OOM).kind == "out of memory"
    assert classify("OutOfMemoryError", small) == classify("OutOfMemoryError", CUDA_OOM)


def test_the_cpu_allocators_refusal_is_explained_as_a_broadcast():
    scores, relevance = torch.zeros(250_000, 1), torch.zeros(250_000)
    with pytest.raises(RuntimeError) as raised:
        _ = scores - relevance
    message = str(raised.value)
    assert is_out_of_memory("RuntimeError", message)
    assert requested_bytes(message) == 250_000 * 250_000 * 4
    case = ReproCase(
        "torch.ops.aten.sub.Tensor", (TensorSpec((250_000, 1)), TensorSpec((250_000,)))
    )
    why = explain_request("aten::sub", case, requested_bytes(message))
    assert why[0] == "(250000, 1) - (250000,) broadcasts to (250000, 250000) float32: 232.83 GiB"


def test_the_cpu_allocators_refusal_is_the_request_alone_in_either_torchs_words():
    """torch 2.13 says "can't allocate memory", older versions "not enough memory": both are
    malloc refusing the request itself, so shrink may write an op-level repro for either."""
    from reprocut.localize.oom_why import request_alone_too_big
    from reprocut.model.oom import cpu_allocator_refused

    new = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 160000000000 bytes."
    old = "DefaultCPUAllocator: not enough memory: you tried to allocate 160000000000 bytes."
    for message in (new, old):
        assert is_out_of_memory("RuntimeError", message) and cpu_allocator_refused(message)
        assert request_alone_too_big(requested_bytes(message), None, "cpu",
                                     cpu_allocator_refused(message))  # fmt: skip
    assert not cpu_allocator_refused("CUDA out of memory. Tried to allocate 4.00 GiB.")


def test_attention_scores_and_promotion_are_named():
    bmm = ReproCase(
        "torch.ops.aten.bmm.default", (TensorSpec((144, 8192, 64)), TensorSpec((144, 64, 8192)))
    )
    (sentence,) = explain_request("aten::bmm", bmm, 144 * 8192 * 8192 * 4)
    assert "(144, 8192, 8192) float32 attention scores: 36.00 GiB" in sentence
    add = ReproCase(
        "torch.ops.aten.add.Tensor",
        (TensorSpec((64, 64), dtype="float16"), TensorSpec((64, 64), dtype="float32")),
    )
    assert any("promoted to float32" in s for s in explain_request("aten::add", add, None))


def test_the_report_survives_json_and_draws():
    report = MemoryReport(
        device="cuda",
        requested_bytes=1 << 30,
        why=("because",),
        held=(("parameters", 10), ("saved for backward", 20)),
        top=(Holder(None, "model.fc", "aten::addmm", 20),),
        steps=(StepMemory(0, 10, 20, 0), StepMemory(1, 30, 40, 20)),
        failing_step=2,
        growth_per_step_bytes=20,
        leak=Leak(None, "aten::relu", 20, "grows", ("`h` (a list)", "its 2 items"), "no_grad"),
    )
    assert MemoryReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    svg = render_svg(report)
    assert svg.startswith("<svg") and "step 2: out of memory" in svg


def test_an_expanded_input_stays_small_in_the_value_less_repro():
    expanded = TensorSpec((400_000, 400_000), stride=(0, 1), requires_grad=True)
    case = ReproCase("torch.ops.aten.eq.Tensor", (TensorSpec((400_000, 1)), expanded))
    assert public_target(case) == "torch.eq"
    assert public_target(ReproCase("torch.ops.aten._softmax_backward_data.default", ())) is None
    forward, backward = empty_case(case), empty_case(case, backward=True)
    assert forward is not None and backward is not None
    code = emit(backward).code
    assert "torch.empty_strided((400000, 400000), (0, 1))" in code, code
    assert "requires_grad" not in code  # a backward op runs under autograd's no-grad
    assert "requires_grad=True" in emit(forward).code
    namespace: dict[str, Any] = {}
    exec(compile(code, "repro.py", "exec"), namespace)
    with pytest.raises(RuntimeError) as raised:  # 160 GB of bool, from 3.2 MB of inputs
        namespace["main"]()
    assert requested_bytes(str(raised.value)) == 400_000 * 400_000


# --- end to end, on the corpus cases -------------------------------------------------------


def _record(case: str, *options: str, cwd: Path) -> tuple[int, dict[str, Any]]:
    script = CORPUS / case / "train.py"
    command = [sys.executable, "-m", "reprocut", "record", "--json", "--quiet", *options]
    done = subprocess.run(
        [*command, str(script), "--device", "cpu"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done.returncode, json.loads(done.stdout)


def _truth(case: str) -> dict[str, Any]:
    return tomllib.loads((CORPUS / case / "case.toml").read_text())["memory"]


def _marked_line(case: str, marker: str = "# reprocut: culprit") -> int:
    lines = (CORPUS / case / "train.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, Any]]]:
    runs = {
        "ranking_broadcast": (),
        "hard_negative_backward": (),
        "val_graph_leak": ("--memory",),
    }
    with ThreadPoolExecutor(2) as pool:
        futures = {
            case: pool.submit(_record, case, *options, cwd=tmp_path_factory.mktemp(case))
            for case, options in runs.items()
        }
        return {case: future.result() for case, future in futures.items()}


OP_LEVEL = ("ranking_broadcast", "hard_negative_backward")


def test_an_op_level_oom_is_reported_with_its_request_and_why(recorded):
    for case in OP_LEVEL:
        code, report = recorded[case]
        truth = _truth(case)
        assert code == 0, report
        assert (report["op"], report["step"], report["phase"]) == (
            truth["op"],
            truth["step"],
            truth["phase"],
        )
        line = report["forward_source"] if truth["phase"] == "backward" else report["source"]
        assert line["line"] == _marked_line(case)  # a backward op: the forward line that built it
        memory = report["memory"]
        assert memory["cause"] == truth["cause"]
        assert memory["requested_bytes"] == truth["requested_bytes"]
        for sentence in truth["why"]:
            assert any(sentence in why for why in memory["why"]), (memory["why"], memory["skipped"])
        assert Path(memory["plot"]).read_text().startswith("<svg")
        assert report["signature"]["kind"] == "out of memory"


# The op's out-of-memory error, then what the script saw on the H200 when PyTorch lost that
# error on its way out of the autograd engine's CUDA thread (recording the allocator's history).
LOST_ERROR = """\
import torch

x = torch.randn(8, 8)
try:
    x.new_empty(2**40)  # 4 TiB
except RuntimeError:
    raise SystemError(
        "<built-in method run_backward of torch._C._EngineBase object at 0x7f00> returned NULL"
        " without setting an exception"
    ) from None
"""


def test_an_oom_that_pytorch_lost_on_the_way_is_reported_as_the_op_raised_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LOST_ERROR)
    command = [sys.executable, "-m", "reprocut", "record", "--json", str(script)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    report = json.loads(done.stdout)
    assert report["error"]["type"] in (
        "OutOfMemoryError",
        "RuntimeError",
    )  # torch < 2.5: the latter
    assert report["signature"]["kind"] == "out of memory"
    assert report["memory"]["requested_bytes"] == 2**42
    assert "lost the op's error on its way to the script" in done.stderr
    assert report["error"]["surfaced_as"]["type"] == "SystemError"


def _shrink(run_dir: str) -> tuple[int, dict[str, Any]]:
    command = [sys.executable, "-m", "reprocut", "shrink", "--json", "--runs", "2", run_dir]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    return done.returncode, json.loads(done.stdout)


def test_an_op_level_oom_shrinks_at_once_to_the_op_on_empty_inputs(recorded):
    """No fork server, no reduction: the op on torch.empty inputs, verified by plain runs."""
    with ThreadPoolExecutor(2) as pool:
        shrunk = dict(
            zip(
                OP_LEVEL,
                pool.map(_shrink, [recorded[c][1]["run_dir"] for c in OP_LEVEL]),
                strict=True,
            )
        )
    for case, (code, result) in shrunk.items():
        assert code == 0 and result["status"] == "verified", (case, result)
        assert result["path"] == "empty-inputs" and result["checks"] == 0
        assert not {"fork_server", "first_check", "shrink"} & set(result["phases"])
        repro = Path(result["repro"]).read_text()
        assert "torch.empty(" in repro and "inputs[" not in repro, repro
        assert not (Path(result["repro"]).parent / "repro_inputs.pt").exists()
        assert "Made without a reduction" in Path(result["report"]).read_text()
    backward = Path(shrunk["hard_negative_backward"][1]["repro"]).read_text()
    assert "new_zeros([200000, 200000])" in backward and "Phase: backward" in backward


def test_record_memory_names_the_growth_the_line_and_the_retaining_list(recorded):
    code, report = recorded["val_graph_leak"]
    truth = _truth("val_graph_leak")
    assert code == 0 and report["status"] == "passed", report
    memory = report["memory"]
    assert memory["growth_per_step_bytes"] > 4 << 20  # the CPU run keeps ~8 MiB a step
    assert memory["evidence"]["claimed"] and memory["evidence"]["rising"] >= 8
    leak = memory["leak"]
    assert leak["retainer"][0].startswith(f"`{truth['retainer']}` (a list made at train.py:")
    assert any("autograd graph" in step for step in leak["retainer"])
    assert leak["kept_at"]["line"] == _marked_line("val_graph_leak", truth["kept_at"])
    forward = _marked_line("val_graph_leak", "return self.body(x)")
    assert leak["line"].endswith(f"train.py:{forward}")  # the activations', in the forward
    assert truth["fix"] in leak["fix"]
    assert Path(memory["plot"]).exists()


# a torch.cuda.memory_snapshot() as an H200 gives it after a run that freed tensors of many
# sizes: two segments, each with live ("active_allocated") and freed ("inactive") blocks
GIB = 1 << 30
SNAPSHOT = [
    {
        "device": 0, "address": 139_000_000_000, "total_size": 40 * GIB, "allocated_size": 28 * GIB,
        "active_size": 28 * GIB, "requested_size": 28 * GIB, "stream": 0,
        "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
        "blocks": [
            {"address": 1, "size": 20 * GIB, "requested_size": 20 * GIB,
             "state": "active_allocated", "frames": []},
            {"address": 2, "size": 6 * GIB, "requested_size": 0, "state": "inactive",
             "frames": []},
            {"address": 3, "size": 8 * GIB, "requested_size": 8 * GIB,
             "state": "active_allocated", "frames": []},
            {"address": 4, "size": 6 * GIB, "requested_size": 0, "state": "inactive",
             "frames": []},
        ],
    },
    {
        "device": 0, "address": 140_000_000_000, "total_size": 10 * GIB, "allocated_size": 2 * GIB,
        "active_size": 2 * GIB, "requested_size": 2 * GIB, "stream": 0,
        "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
        "blocks": [
            {"address": 5, "size": 2 * GIB, "requested_size": 2 * GIB,
             "state": "active_pending_free", "frames": []},
            {"address": 6, "size": 8 * GIB, "requested_size": 0, "state": "inactive",
             "frames": []},
        ],
    },
]  # fmt: skip


def test_fragmentation_from_a_snapshot_says_when_expandable_segments_would_help():
    largest, expandable = snapshot_free_blocks(SNAPSHOT)
    assert (largest, expandable) == (8 * GIB, False)
    cached = 20 * GIB  # reserved 50 GiB, allocated 30 GiB: 6 + 6 + 8 GiB free, in pieces
    split = fragmentation(12 * GIB, cached=cached, device_free=GIB, largest=largest,
                          expandable=expandable)  # fmt: skip
    assert split.expandable_segments_would_help and split.largest_free_block == 8 * GIB
    assert "expandable_segments:True would have helped" in split.text
    short = fragmentation(40 * GIB, cached=cached, device_free=GIB, largest=largest,
                          expandable=expandable)  # fmt: skip
    assert short.expandable_segments_would_help is False and "not enough" in short.text
    on = [{**segment, "is_expandable": True} for segment in SNAPSHOT]
    already = fragmentation(12 * GIB, cached=cached, device_free=GIB,
                            largest=largest, expandable=snapshot_free_blocks(on)[1])  # fmt: skip
    assert already.expandable_segments_would_help is False and "on already" in already.text


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_snapshot_of_a_real_cuda_allocator_is_read():
    kept = [torch.empty(1 << 20, device="cuda") for _ in range(8)]
    del kept[::2]  # four freed blocks between live ones: the cache holds them
    largest, _ = snapshot_free_blocks(torch.cuda.memory_snapshot())
    assert largest >= 4 << 20


def test_library_workspaces_are_the_untracked_blocks_a_math_library_allocated():
    """cuBLAS's and cuBLASLt's workspaces (64 MiB on an H200) go through PyTorch's allocator
    from no op: known by their allocation stacks, not counted twice when an op made them."""
    cublas = [{"name": "at::cuda::getCurrentCUDABlasHandle()", "filename": "", "line": 0}]
    op = [{"name": "at::native::empty_cuda", "filename": "", "line": 0}]
    segments = [{"blocks": [
        {"address": 1, "size": 32 << 20, "state": "active_allocated", "frames": cublas},
        {"address": 2, "size": 8 << 20, "state": "active_allocated", "frames": op},
        {"address": 3, "size": 32 << 20, "state": "inactive", "frames": cublas},
        {"address": 4, "size": 16 << 20, "state": "active_allocated", "frames": cublas},
        {"address": 5, "size": 4 << 20, "state": "active_allocated", "frames": []},
    ]}]  # fmt: skip
    assert library_blocks(segments, tracked={4}) == 32 << 20
    assert library_blocks(segments, tracked=set()) == 48 << 20


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cublas_workspace_of_a_real_matmul_is_recognized():
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        a = torch.randn(256, 256, device="cuda")
        b = a @ a
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    tracked = {a.data_ptr(), b.data_ptr()}
    assert library_blocks(snapshot["segments"], tracked) >= 1 << 20


def test_a_forward_output_only_autograd_holds_is_saved_for_backward_without_a_walk():
    """During a failed backward on a GPU the graph walk from the user's tensors stops early;
    a forward output that no Python tensor shares is still known as saved for backward."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from reprocut.record.inside.memory import Allocation
    from reprocut.record.inside.retainers import roles

    x = torch.randn(64, requires_grad=True)
    node = x.exp().sum().grad_fn  # ExpBackward0 keeps exp's result; no tensor refers to it
    saved = node.next_functions[0][0]._saved_result.untyped_storage()
    loose = torch.randn(8)  # a live tensor of the user's: not saved
    live = {
        store._cdata: Allocation(
            StorageWeakRef(store), store.data_ptr(), store.nbytes(), 1, "forward", op, None, None
        )
        for store, op in ((saved, "aten::exp"), (loose.untyped_storage(), "aten::randn"))
    }
    del saved  # the storage object above was only a handle
    role, _, walked = roles(live)
    assert sorted(role.values()) == ["other live tensors", "saved for backward"]
    assert walked["inferred_saved"] == 1 and node is not None


def test_a_backward_oom_takes_its_forward_line_from_the_memory_rerun():
    """On a GPU the first run tags autograd nodes only in steps it watches every public call:
    the rerun's culprit (every step watched) gives the forward line."""
    from reprocut.localize.memory import with_forward_line
    from reprocut.model.recording import ErrorInfo, Failure

    oom = classify("OutOfMemoryError", "CUDA out of memory. Tried to allocate 149.01 GiB.")
    failure = Failure("localized", ErrorInfo("OutOfMemoryError", "CUDA out of memory"), oom,
                      op="aten::new_zeros", phase="backward")  # fmt: skip
    line = {"file": "/x/train.py", "line": 24, "text": "hardest = grid.gather(1, mined)"}
    found = with_forward_line(failure, {"op": "aten::new_zeros", "forward_source": line})
    assert found.forward_source is not None and found.forward_source.line == 24
    assert found.source == found.forward_source
    assert with_forward_line(failure, {"op": "aten::mm", "forward_source": line}) == failure
    assert with_forward_line(failure, None) == failure


def test_reprocuts_own_frames_do_not_keep_the_failing_ops_inputs_alive(tmp_path: Path):
    """The memory watch's frame that ran the failing op holds its arguments; after at_failure
    they are the user's or nobody's (a saved activation is then held only by autograd)."""
    import gc
    import weakref

    from reprocut.record.inside.frames import UserFrames
    from reprocut.record.inside.memory import MemoryWatch
    from reprocut.record.inside.state import RunState

    watch = MemoryWatch(RunState(), UserFrames(), tmp_path, cuda_history=False)
    error = None
    with watch:
        try:
            torch.ones(1000).new_empty(1 << 50)  # the CPU allocator refuses 4 PiB
        except RuntimeError as exc:
            error = exc
    assert error is not None and error.__traceback__ is not None
    held = [weakref.ref(o) for o in gc.get_objects()
            if isinstance(o, torch.Tensor) and o.numel() == 1000]  # fmt: skip
    assert held and all(r() is not None for r in held)  # the watch's frame keeps the input
    assert watch.failure is not None and watch.failure["op"] == "aten::new_empty"  # taken inside
    watch.at_failure(error)
    gc.collect()
    assert all(r() is None for r in held)


class _Saved:
    """A SavedTensor as Python sees it: `.data` without unpacking, no hook."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.data, self.unpack_hook = tensor, None


class _Node:
    """A C++ autograd node as Python sees it: a wrapper made on each access, freed after."""

    def __init__(self, index: int, chain: list) -> None:
        self._index, self._chain = index, chain

    @property
    def _raw_saved_self(self) -> _Saved:
        return _Saved(self._chain[self._index])

    @property
    def next_functions(self) -> tuple:
        following = self._index + 1
        return ((_Node(following, self._chain), 0),) if following < len(self._chain) else ()


def test_a_walk_of_autograd_nodes_keeps_their_wrappers_so_no_id_is_reused():
    """Wrappers made per access, as Python's of C++ nodes are: a walk keeping only their ids
    skips a node whose wrapper got a freed one's id (on the H200 a walk with a set of ids
    stopped at 24 nodes of 16 validation graphs)."""
    from reprocut.record.inside.autograd_graph import Graphs

    chain = [torch.full((4,), float(i)) for i in range(60)]
    found = [saved for _, saved in Graphs().walk(_Node(0, chain))]
    assert len(found) == 60


def test_reading_a_frames_locals_keeps_none_of_them_alive():
    """f_locals before Python 3.13 is a copy the frame keeps: what a read saw stays referenced
    after the function rebinds the name. local_values reads them and leaves no copy behind,
    and leaves the dict alone under a tracer (which writes it back into the variables)."""
    import gc
    import weakref

    from reprocut.record.inside.frame_locals import local_values

    def step() -> tuple[weakref.ref, bool, bool]:
        batch = torch.ones(1000)
        seen = local_values(sys._getframe())
        assert seen["batch"] is batch
        old = weakref.ref(batch)
        del seen
        batch = torch.zeros(1000)  # the next step's batch replaces it
        gc.collect()
        return old, old() is None, float(batch.sum()) == 0.0

    old, freed, intact = step()
    assert freed and intact and old() is None

    def traced() -> bool:
        value = [1, 2, 3]
        frame = sys._getframe()
        kept = frame.f_locals  # before 3.13: the very dict the frame keeps
        sys.settrace(lambda *args: None)
        try:
            local_values(frame)
        finally:
            sys.settrace(None)
        return "value" in kept and value == [1, 2, 3]

    previous = sys.gettrace()
    try:
        assert traced()
    finally:
        sys.settrace(previous)
