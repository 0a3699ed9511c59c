"""A custom kernel's fault on a GPU is localized by one rerun after the failing run: the blocking
rerun names the launch line and reads what reached the kernel as it goes (run on a GPU; skipped
elsewhere). The same path on the CPU, with library-launched stand-in kernels: test_kernel_facts.

On the H200 record spent 30-47 s after a 9-14 s run before: a non-blocking rerun synchronizing
around ops, then a blocking one that named the launch line, then one more run to read the
launch's inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reprocut.model.errors import ExitCode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.corpus_cases import CORPUS, load_case  # noqa: E402

pytestmark = pytest.mark.cuda


def record(tmp_path: Path, case: str) -> tuple[dict, Path]:
    folder = CORPUS / case
    done = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--json", "--quiet", "--timeout", "240",
         "--root", str(tmp_path), "train.py"],
        capture_output=True, text=True, timeout=900, cwd=folder, check=False,
    )  # fmt: skip
    assert done.returncode == ExitCode.OK, done.stderr[-3000:]
    report = json.loads(done.stdout)
    return report, Path(report["run_dir"])


def runs_after_the_first(run: Path) -> list[str]:
    """The script's runs after the failing one: the attempts' config files, and `probe` when
    the launch's inputs were read by a run of their own."""
    attempts = sorted(path.name.split(".")[0] for path in run.glob("*.config.json"))
    kept = run / "launch_probe.json"
    probed = kept.exists() and json.loads(kept.read_text())["read_by"] == "probe"
    return [a for a in attempts if a != "record"] + (["probe"] if probed else [])


@pytest.mark.parametrize(
    ("case", "library"),
    [("cuda_cupy_misaligned_vec4", "cupy"), ("cuda_triton_expand_bias", "triton")],
)
def test_a_custom_kernels_fault_takes_one_rerun(tmp_path: Path, case: str, library: str):
    pytest.importorskip(library)
    truth = load_case(CORPUS / case)
    report, run = record(tmp_path, case)
    assert report["status"] == "outside-dispatcher"
    assert report["kernel"] == truth.kernel
    assert report["step"] == truth.step
    marker = truth.culprit()
    assert marker is not None
    assert Path(report["source"]["file"]).name == Path(marker[0]).name
    assert report["source"]["line"] == marker[1]
    assert all(fact in " ".join(report["facts"]) for fact in truth.facts), report["facts"]
    assert runs_after_the_first(run) == ["localize"]
    meta = json.loads((run / "meta.json").read_text())
    print(f"{case}: run {meta['seconds']} s, localized in {meta['localize_seconds']} s")


def test_raw_pointers_reaching_a_cupy_kernel_are_named_as_pointers(tmp_path: Path):
    """corpus/cuda_cupy_host_pointers hands `ids.data_ptr()`, `table.data_ptr()` and
    `out.data_ptr()` to a CuPy kernel: three device addresses (about 1.4e14), not offsets."""
    pytest.importorskip("cupy")
    report, run = record(tmp_path, "cuda_cupy_host_pointers")
    assert report["status"] == "outside-dispatcher"
    assert report["kernel"] == "gather_rows_kernel"
    facts = {t["name"]: t["facts"] for t in report["tensors"]}
    kept = json.loads((run / "launch_probe.json").read_text())["found"]
    address = {p["name"]: p["address"] for p in kept["pointers"]}
    for name in ("ids", "table", "out"):
        assert any(f.startswith(f"its address ({address[name]:#x}) reaches the kernel") for f in facts[name]), facts  # fmt: skip
    assert not any("2**31" in f for f in report["facts"]), report["facts"]
    assert any("≥ 50000 rows of `table`" in f for f in facts["ids"]), facts["ids"]
    assert runs_after_the_first(run) == ["localize"]


def test_a_custom_ops_fault_shows_its_kernels_launch_with_the_call_beside_it(tmp_path: Path):
    """corpus/cuda_triton_op_compiled: `fused::gated` (a triton_op in kernels.py) is called by
    the compiled model at train.py; its Triton kernel reads past the expand()ed gate. Under
    torch.compile the report named the Inductor kernel launched after it."""
    pytest.importorskip("triton")
    truth = load_case(CORPUS / "cuda_triton_op_compiled")
    report, run = record(tmp_path, "cuda_triton_op_compiled")
    assert report["op"] == "fused::gated" and report["step"] == truth.step
    marker = truth.culprit()
    assert marker is not None
    assert (Path(report["source"]["file"]).name, report["source"]["line"]) == (
        "train.py",
        marker[1],
    )
    launch = report["launch"]
    assert launch is not None and Path(launch["file"]).name == "kernels.py"
    assert "wrap_triton(gated_kernel)" in launch["text"]
    assert report["torch_compile"]["kernel"] is None  # no Inductor kernel asserted
    assert runs_after_the_first(run) == ["localize"]
