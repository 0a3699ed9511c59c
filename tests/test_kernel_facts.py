"""Facts from the values reaching a custom kernel: ids against the table's rows, int32 offsets.

The rules are checked on launches as probe_launch describes them (the shapes of the corpus's
CuPy hashed-ids and Triton int32-offset cases, whose kernels need a GPU); then `reprocut record`
on a CPU script whose library-launched kernel trusts its ids reads them at the launch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from reprocut.cli import main
from reprocut.localize.kernel_facts import kernel_facts, offset_facts
from reprocut.model.case import TensorSpec
from reprocut.model.errors import ExitCode
from reprocut.model.tensors import spec_of
from reprocut.record.inside.launch_read import (
    MISSING,
    LaunchCall,
    evaluate_safe,
    integer_range,
    read_frame,
)
from reprocut.source.focus import launch_grid_source
from reprocut.source.launch_specs import (
    IntegerRange,
    LaunchSpecs,
    LaunchValues,
    launch_specs_from_json,
)

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(REPO))

from benchmarks.corpus_cases import CORPUS, load_case  # noqa: E402


def hashed_ids_launch(high: int) -> tuple[LaunchSpecs, list[tuple[str, TensorSpec]]]:
    """corpus/cuda_cupy_hashed_ids at step 6: ids (256, 7) int64, table (65536, 32), out."""
    tensors = [
        ("ids", TensorSpec((256, 7), dtype="int64", device="cuda")),
        ("table", TensorSpec((1 << 16, 32), device="cuda")),
        ("out", TensorSpec((256, 32), device="cuda")),
    ]
    probed = LaunchSpecs(
        integers=(("ids", IntegerRange(3, high, (0, 2), (17, 6), 256 * 7)),),
        launch=LaunchValues(args=((16,), (128,), None), library="cupy"),
    )
    return probed, tensors


def test_an_id_past_the_table_is_named_with_how_far_past_its_end_it_reads():
    probed, tensors = hashed_ids_launch(high=1_099_494_850_610)
    facts = kernel_facts(probed, tensors)
    assert facts == {
        "ids": (
            "id max 1099494850610 ≥ 65536 rows of `table` at [17, 6]",
            "row 1099494850610 starts 128.0 TiB past the end of `table`",
        )
    }
    truth = load_case(CORPUS / "cuda_cupy_hashed_ids")  # what the corpus scores on the H200
    assert all(fact in " ".join(facts["ids"]) for fact in truth.facts)


def test_ids_within_the_table_and_negative_ids():
    probed, tensors = hashed_ids_launch(high=65535)
    assert kernel_facts(probed, tensors) == {
        "ids": ("1792 ids in [3, 65535], within the 65536 rows of `table`",)
    }
    negative = LaunchSpecs(integers=(("ids", IntegerRange(-1, 9, (4, 0), (0, 0), 256 * 7)),))
    assert kernel_facts(negative, tensors) == {"ids": ("id -1 < 0 at [4, 0]",)}
    alone = kernel_facts(negative, tensors[:1])  # no table beside it: only the range
    assert alone == {"ids": ("id -1 < 0 at [4, 0]", "1792 values in [-1, 9]")}


def test_a_triton_grid_whose_int32_offsets_wrap():
    """corpus/cuda_triton_int32_offsets: 2.49e9 logits, grid cdiv(n, 1024), BLOCK=1024."""
    n = 8 * 2048 * 151_936
    logits = TensorSpec((8, 2048, 151_936), dtype="bfloat16", device="cuda")
    probed = LaunchSpecs(
        launch=LaunchValues(
            args=(None, None, n, 0.5),
            keywords=(("BLOCK", 1024),),
            grid=((n + 1023) // 1024,),
            library="triton",
        )
    )
    facts = kernel_facts(probed, [("logits", logits), ("out", logits)])
    assert facts == {
        "logits": (
            "grid 2430976 × BLOCK 1024: offsets reach 2489319423, past 2**31 - 1; computed in "
            "int32 they wrap negative from program 2097152 on (down to -2147483648)",
        )
    }
    truth = load_case(CORPUS / "cuda_triton_int32_offsets")
    assert all(fact in facts["logits"][0] for fact in truth.facts)
    small = LaunchValues(keywords=(("BLOCK", 1024),), grid=(4,), library="triton")
    assert offset_facts(small) == ()


def test_a_cupy_grid_and_a_plain_integer_past_int32():
    assert offset_facts(LaunchValues(args=((1 << 22,), (1024,), None), library="cupy")) == (
        "grid 4194304 × block 1024: offsets reach 4294967295, past 2**31 - 1; computed in int32 "
        "they wrap negative from program 2097152 on (down to -2147483648)",
    )
    # an integer past int32 is an offset that wraps only where it can count into a tensor there
    plain = LaunchValues(args=(None, 3_000_000_000), library="mylib")
    bytes_3g = TensorSpec((3_000_000_000,), dtype="uint8", device="cuda")
    assert offset_facts(plain, [bytes_3g]) == (
        "integer argument 3000000000 reaches the kernel, past 2**31 - 1 (an int32 offset wraps)",
    )
    assert offset_facts(plain, [TensorSpec((4096,), device="cuda")]) == ()
    assert offset_facts(plain) == ()


class LaunchedFrom:
    """A library's kernel object (CuPy's RawKernel, say): called, it keeps the frame that
    launched it, so the reader sees that frame as the blocking rerun's tracer does."""

    name = "rowsum_vec4"
    frame = None

    def __call__(self, grid, block, args):
        self.frame = sys._getframe(1)


ROWSUM = LaunchedFrom()
POINTER_LAUNCH = (
    "ROWSUM((x.shape[0],), (64,), (x.data_ptr(), out.data_ptr(), x.shape[0], x.stride(0)))"
)


def rowsum(x, out):
    ROWSUM((x.shape[0],), (64,), (x.data_ptr(), out.data_ptr(), x.shape[0], x.stride(0)))


def read_launch(launch_of: Callable[[], None], focus: str) -> LaunchSpecs:
    """What the blocking rerun's reader takes from the launching frame, after the fault: no
    work evaluated, ranges as noted (here read now: CPU tensors)."""
    launch_of()
    assert ROWSUM.frame is not None
    call = LaunchCall.from_focus(focus)
    found = read_frame(ROWSUM.frame, call, evaluate=evaluate_safe, integers=integer_range)
    return launch_specs_from_json(json.loads(json.dumps(found)))  # as the run folder keeps it


def test_integers_that_are_live_tensors_addresses_are_named_as_their_pointers():
    """A CuPy kernel fed `x.data_ptr()` was told "integer argument 139735081191424 reaches the
    kernel, past 2**31 - 1 (an int32 offset wraps)", once per pointer. They are the addresses of
    the real tensors here (CPU allocations, 64-byte aligned); the fact that explains the
    misaligned float4 loads is the 65-float row stride of the padded buffer."""
    padded = torch.randn(32, 65)
    x, out = padded[:, :64], torch.empty(32)
    assert x.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0  # c10's CPU alignment
    probed = read_launch(lambda: rowsum(x, out), POINTER_LAUNCH)
    assert probed.launch.args[2] == (x.data_ptr(), out.data_ptr(), 32, 65)
    assert [p.name for p in probed.pointers] == ["x", "out"]
    tensors = list(probed.params)
    facts = kernel_facts(probed, tensors, misaligned=True)
    assert facts == {
        "x": (
            f"its address ({x.data_ptr():#x}) reaches the kernel as an integer (16-byte aligned)",
            "rows 65 elements (260 B) apart: 3 of every 4 rows start off a 16-byte boundary, "
            "where a 16-byte (float4) load of the row is misaligned",
        ),
        "out": (
            f"its address ({out.data_ptr():#x}) reaches the kernel as an integer (16-byte aligned)",
        ),
    }
    # an illegal address (not a misaligned one): the rows' alignment does not bear on it
    assert "x" in kernel_facts(probed, tensors) and len(kernel_facts(probed, tensors)["x"]) == 1
    shifted = padded[:, 1:]  # one float in: the data starts 4 B past the boundary
    moved = kernel_facts(read_launch(lambda: rowsum(shifted, out), POINTER_LAUNCH), tensors,
                         misaligned=True)  # fmt: skip
    assert moved["x"] == (
        f"its address ({shifted.data_ptr():#x}) reaches the kernel as an integer "
        "(4 B past a 16-byte boundary)",
        "rows 65 elements (260 B) apart: 3 of every 4 rows start off a 16-byte boundary, "
        "where a 16-byte (float4) load of the row is misaligned",
    )


def test_an_address_inside_a_storage_and_an_integer_that_counts_into_nothing():
    table = torch.zeros(16, 65)
    second_row = "ROWSUM((1,), (64,), (table.data_ptr() + 260, 1 << 40, 16))"

    def launch() -> None:
        ROWSUM((1,), (64,), (table.data_ptr() + 260, 1 << 40, 16))

    probed = read_launch(launch, second_row)
    assert probed.launch.args[2] == (table.data_ptr() + 260, 1 << 40, 16)
    facts = kernel_facts(probed, [("table", spec_of(table))])
    assert facts == {
        "table": (
            f"an address 260 B into its storage ({table.data_ptr() + 260:#x}) reaches the "
            "kernel as an integer (4 B past a 16-byte boundary)",
        )
    }  # 2**40 is neither an address here nor a count into 4160 B: nothing is said of it


def test_the_reader_runs_nothing_after_a_fault():
    """Calls that read (`data_ptr`, `stride`, `np.int32`) are evaluated; work is not."""
    import numpy as np

    x = torch.arange(6).view(2, 3)
    frame = sys._getframe()
    assert evaluate_safe("(x.data_ptr(), x.stride(0), x.shape[1] * 2, np.int32(7))", frame) == (
        x.data_ptr(),
        3,
        6,
        np.int32(7),
    )
    for work in ("x * 2", "x.sum()", "x.contiguous()", "torch.ones(3)", "print(x)"):
        assert evaluate_safe(work, frame) is MISSING, work


def test_the_grid_of_a_subscripted_launch_is_read_from_its_text():
    assert launch_grid_source("k[grid](x, out, n, BLOCK=1024)") == "grid"
    assert launch_grid_source("out = k[(n // 4, 1)](x)") == "(n // 4, 1)"
    assert launch_grid_source("_KERNEL((blocks,), (threads,), args)") is None


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kernel-facts")
    script = SCRIPTS / "hashed_ids_kernel.py"
    code = main(["record", "--json", "--quiet", "--root", str(root), str(script)])
    assert code == ExitCode.OK
    return next((root / "runs").iterdir())


@pytest.fixture(scope="module")
def recorded(recorded_run: Path) -> dict:
    return json.loads(recorded_run.joinpath("failure.json").read_text())


def runs_after_the_first(run: Path) -> list[str]:
    """The runs of the script record started after the failing one, by the attempt names their
    config files carry; a probe of the launch (a run of its own) shows as `probe`."""
    attempts = sorted(path.name.split(".")[0] for path in run.glob("*.config.json"))
    kept = json.loads((run / "launch_probe.json").read_text())
    return [a for a in attempts if a != "record"] + (
        ["probe"] if kept["read_by"] == "probe" else []
    )


def test_record_reads_the_ids_reaching_a_library_launched_kernel(recorded: dict, recorded_run):
    assert recorded["status"] == "outside-dispatcher" and recorded["kernel"] == "hashed_bag"
    tensors = {t["name"]: t for t in recorded["tensors"]}
    assert set(tensors) == {"ids", "table"}
    assert tensors["ids"]["facts"] == [
        "id max 1099511627783 ≥ 64 rows of `table` at [7, 3]",
        "row 1099511627783 starts 16.0 TiB past the end of `table`",
    ]
    # one rerun after the failing run names the launch line and reads what reached it
    assert runs_after_the_first(recorded_run) == ["localize"]


def test_record_names_the_pointers_a_kernel_is_handed_and_the_rows_they_misalign(tmp_path):
    """tests/scripts/pointer_rows_kernel.py: `x.data_ptr()` and `out.data_ptr()` reach a
    float4 row kernel; from step 2 the rows are 65 floats apart."""
    code = main(["record", "--json", "--quiet", "--root", str(tmp_path),
                 str(SCRIPTS / "pointer_rows_kernel.py")])  # fmt: skip
    assert code == ExitCode.OK
    run = next((tmp_path / "runs").iterdir())
    failure = json.loads((run / "failure.json").read_text())
    assert failure["status"] == "outside-dispatcher" and failure["kernel"] == "rowsum_vec4"
    assert failure["signature"]["error_code"] == 716
    kept = json.loads((run / "launch_probe.json").read_text())["found"]
    address = {p["name"]: p["address"] for p in kept["pointers"]}
    tensors = {t["name"]: t["facts"] for t in failure["tensors"]}
    assert tensors == {
        "x": [
            "not contiguous: stride (65, 1) for shape (32, 64)",
            f"its address ({address['x']:#x}) reaches the kernel as an integer (16-byte aligned)",
            "rows 65 elements (260 B) apart: 3 of every 4 rows start off a 16-byte boundary, "
            "where a 16-byte (float4) load of the row is misaligned",
        ],
        "out": [
            f"its address ({address['out']:#x}) reaches the kernel as an integer (16-byte aligned)"
        ],
    }
    assert kept["launch"]["args"][2] == [address["x"], address["out"], 32, 65]
    assert runs_after_the_first(run) == ["localize"]


TRITON_LIKE = """\
import torch


class Launcher:  # a JIT kernel's `kernel[grid]`: its offsets wrap past 2**31 (as Triton's do)
    def __getitem__(self, grid):
        def launch(x, out, n, scale, BLOCK):
            if grid[0] * BLOCK > 2**31:
                raise RuntimeError("an illegal memory access was encountered")
        return launch


scale_kernel = Launcher()


def scale(logits, n):
    out = torch.empty_like(logits)
    grid = ((n + 1023) // 1024,)
    scale_kernel[grid](logits, out, n, 0.5, BLOCK=1024)


x = torch.zeros(1).expand(4096)
for n in (4096, 2_489_319_424):
    scale(x, n)
"""


def test_probe_launch_reads_the_grid_keywords_and_numbers_of_a_subscripted_launch(tmp_path: Path):
    from reprocut.source.probe import probe_launch

    script = tmp_path / "train.py"
    script.write_text(TRITON_LIKE)
    focus = "scale_kernel[grid](logits, out, n, 0.5, BLOCK=1024)"
    line = TRITON_LIKE.splitlines().index("    " + focus) + 1
    probed = probe_launch(script, cwd=tmp_path, argv=[], file=script, line=line, focus=focus)
    assert probed.launch == LaunchValues(
        args=(None, None, 2_489_319_424, 0.5),
        keywords=(("BLOCK", 1024),),
        grid=(2_430_976,),
        library="__main__",
    )
    facts = kernel_facts(probed, [("logits", probed.args[0]), ("out", probed.args[1])])
    assert list(facts) == ["logits"] and "wrap negative from program 2097152" in facts["logits"][0]


def test_shrink_takes_the_launch_record_read_instead_of_running_the_script_twice(recorded_run):
    from reprocut.model.recording import RunDir
    from reprocut.source.recorded import recorded_launch, reducible_files

    run = RunDir(recorded_run)
    failure = run.read_failure()
    script = Path(failure.script).resolve()
    editable = reducible_files(script, (script.parent,))
    kept = recorded_launch(run.launch_probe_path, script, list(failure.argv), editable)
    assert kept is not None and kept.file == script
    assert kept.focus.strip() == "_KERNEL((1,), (128,), args)"
    assert kept.specs.kernel == "hashed_bag"
    assert dict(kept.specs.params)["ids"].shape == (8, 4)  # step 2's ids, the new field in
    assert recorded_launch(run.launch_probe_path, script, ["--other"], editable) is None
    code = main(["shrink", "--json", str(recorded_run)])
    assert code == ExitCode.OK
    repro = (recorded_run / "repro.py").read_text()
    assert "_KERNEL(" in repro and "for step in" not in repro
    # the ids come back across the range they had at the launch, out-of-range ones included
    assert "torch.randint(2, 1099511627784, (8, 4))" in repro
