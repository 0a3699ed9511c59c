"""torchrun jobs on a GPU (run by `STAGES=ranks benchmarks/gpu_batch.sh`): the corpus/distributed/
cases with CUDA tensors (DEVICE=cuda), two ranks sharing the one GPU over gloo, whose collectives
accept CUDA tensors. The faulting rank's device-side assert surfaces later (in DDP's all-reduce
or at a step boundary); reprocut must still name that rank, its op, line and step, and shrink
its recording to a single-process CUDA repro. With two GPUs or more, the NCCL form runs too
(one GPU per rank: NCCL refuses two ranks on one GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ranks import DISTRIBUTED, TORCHRUN_MODULE, record_job, reprocut, truth

from reprocut.model.errors import ExitCode
from reprocut.model.job import rank_path

pytestmark = pytest.mark.cuda
CASES = ("ddp_grown_vocab", "ddp_label_shard")


def record_cuda(cwd: Path, name: str, backend: str = "gloo") -> dict[str, Any]:
    return record_job(
        cwd,
        *TORCHRUN_MODULE,
        "--nproc-per-node",
        "2",
        str(DISTRIBUTED / name / "train.py"),
        options=("--timeout", "180"),
        env={"DEVICE": "cuda", "BACKEND": backend},
    )


def assert_cuda_truth(report: dict[str, Any], name: str) -> None:
    expected = truth(name)
    assert report["_code"] == ExitCode.OK, report["_stderr"][-4000:]
    assert report["status"] == "localized", report
    assert report["rank"] == expected["rank"] and report["world_size"] == 2
    assert report["op"] == expected["cuda"].get("op", expected["op"])
    assert report["step"] == expected["step"]
    assert report["source"]["line"] == expected["line"]
    assert report["signature"]["error_code"] == expected["cuda"]["error_code"]
    assert report["signature"]["kind"] == expected["cuda"]["kind"]
    assert report["device"].startswith("cuda")
    assert report["localization"] in ("in-process", "snapshot-replay")
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[1 - expected["rank"]]["status"] == "consequence", by_rank


@pytest.fixture(scope="module")
def cuda_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {name: record_cuda(tmp_path_factory.mktemp(name), name) for name in CASES}


@pytest.mark.parametrize("name", CASES)
def test_device_assert_on_one_rank_sharing_the_gpu_is_localized_to_that_rank(cuda_jobs, name):
    assert_cuda_truth(cuda_jobs[name], name)


def test_shrink_of_the_cuda_culprit_rank_is_a_verified_single_process_repro(cuda_jobs, tmp_path):
    job = Path(cuda_jobs["ddp_grown_vocab"]["run_dir"])
    done = reprocut(job.parent.parent.parent, "shrink", "--json", str(job), "--timeout", "90")
    assert done.returncode == ExitCode.OK, done.stderr[-4000:]
    assert json.loads(done.stdout)["status"] == "verified"
    repro = rank_path(job, 1) / "repro.py"
    code = repro.read_text()
    assert "cuda" in code and "distributed" not in code
    alone = tmp_path / "repro.py"
    alone.write_text(code)
    plain = subprocess.run(
        [sys.executable, str(alone)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert plain.returncode != 0 and "device-side assert" in plain.stderr + plain.stdout


def test_nccl_one_gpu_per_rank_names_the_faulting_rank(tmp_path):
    if torch.cuda.device_count() < 2:  # NVML-based (conftest): CUDA stays untouched here
        pytest.skip("NCCL needs one GPU per rank (issue #16)")
    report = record_cuda(tmp_path, "ddp_grown_vocab", backend="nccl")
    assert_cuda_truth(report, "ddp_grown_vocab")
