"""Facts from the values reaching a custom kernel: ids against the table's rows, int32 offsets.

The rules are checked on launches as probe_launch describes them (the shapes of the corpus's
CuPy hashed-ids and Triton int32-offset cases, whose kernels need a GPU); then `reprocut record`
on a CPU script whose library-launched kernel trusts its ids reads them at the launch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reprocut.cli import main
from reprocut.localize.kernel_facts import kernel_facts, offset_facts
from reprocut.model.case import TensorSpec
from reprocut.model.errors import ExitCode
from reprocut.source.focus import launch_grid_source
from reprocut.source.launch_specs import IntegerRange, LaunchSpecs, LaunchValues

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
    assert offset_facts(LaunchValues(args=(None, 3_000_000_000), library="mylib")) == (
        "integer argument 3000000000 reaches the kernel, past 2**31 - 1 (an int32 offset wraps)",
    )


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


def test_record_reads_the_ids_reaching_a_library_launched_kernel(recorded: dict):
    assert recorded["status"] == "outside-dispatcher" and recorded["kernel"] == "hashed_bag"
    tensors = {t["name"]: t for t in recorded["tensors"]}
    assert set(tensors) == {"ids", "table"}
    assert tensors["ids"]["facts"] == [
        "id max 1099511627783 ≥ 64 rows of `table` at [7, 3]",
        "row 1099511627783 starts 16.0 TiB past the end of `table`",
    ]


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
