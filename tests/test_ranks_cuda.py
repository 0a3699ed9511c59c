"""torchrun jobs on a GPU (run by `STAGES=ranks benchmarks/gpu_batch.sh`): the corpus/distributed/
cases with CUDA tensors (DEVICE=cuda), two ranks sharing the one GPU over gloo, whose collectives
accept CUDA tensors. The faulting rank's device-side assert surfaces later (in DDP's all-reduce
or at a step boundary); reprocut must still name that rank, its op, line and step, and shrink
its recording to a single-process CUDA repro. When that rank dies before reporting (on the H200
it did, by SIGSEGV or SIGABRT), the job runs again with it synchronized at its last steps.
The two jobs run side by side, each on its own rendezvous port; a failed assertion prints what
every rank left on its stderr, in each run of the job. With two GPUs or more, the NCCL form
runs too (one GPU per rank: NCCL refuses two ranks on one GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ranks import DISTRIBUTED, TORCHRUN_MODULE, free_port, record_job, reprocut, truth

from reprocut.model.errors import ExitCode
from reprocut.model.job import rank_folders, rank_path, tail_of

pytestmark = pytest.mark.cuda
CASES = ("ddp_grown_vocab", "ddp_label_shard")


def record_cuda(
    cwd: Path, name: str, backend: str = "gloo", port: int | None = None
) -> dict[str, Any]:
    report = record_job(
        cwd,
        *TORCHRUN_MODULE,
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{port or free_port()}",
        str(DISTRIBUTED / name / "train.py"),
        options=("--timeout", "120"),
        env={"DEVICE": "cuda", "BACKEND": backend},
    )
    return {**report, "_cwd": str(cwd)}


def what_ranks_saw(report: dict[str, Any]) -> str:
    """reprocut's own stderr, then the end of every rank's stderr in each run of the job: from
    the report, or from the run folder when the report has none (an error before a Failure)."""
    parts = [f"== reprocut (exit {report['_code']})\n{report['_stderr'][-3000:]}"]
    for rank in report.get("ranks", ()):
        parts.append(f"== rank {rank['rank']} ({rank['status']}, {rank['kind']})")
        parts.append(rank.get("stderr_tail", ""))
    for rerun in report.get("job_reruns", ()):
        for end in rerun["ranks"]:
            parts.append(f"== rerun ({rerun['attempt']}) rank {end['rank']}: {end}")
    folder = report.get("run_dir") or _latest_run(Path(report["_cwd"]))
    if not report.get("ranks") and folder:
        for rank, path in sorted(rank_folders(Path(folder)).items()):
            for log in sorted(path.glob("*.stderr.txt")):
                parts.append(f"== rank {rank}: {log.name}\n{tail_of(log.read_text())}")
    return "\n".join(parts)


def _latest_run(cwd: Path) -> str | None:
    latest = cwd / ".reprocut" / "latest"
    return str(cwd / ".reprocut" / "runs" / latest.read_text().strip()) if latest.exists() else None


def assert_cuda_truth(report: dict[str, Any], name: str) -> None:
    expected = truth(name)
    saw = what_ranks_saw(report)
    assert report["_code"] == ExitCode.OK, saw
    assert report["status"] == "localized", saw
    assert report["rank"] == expected["rank"] and report["world_size"] == 2, saw
    assert report["op"] == expected["cuda"].get("op", expected["op"]), saw
    assert report["step"] == expected["step"], saw
    assert report["source"]["line"] == expected["line"], saw
    assert report["signature"]["error_code"] == expected["cuda"]["error_code"], saw
    assert report["signature"]["kind"] == expected["cuda"]["kind"], saw
    assert report["device"].startswith("cuda"), saw
    assert report["localization"] in ("in-process", "snapshot-replay", "rerun"), saw
    if report["localization"] == "rerun":  # the rank died before reporting: the job ran again
        assert report["job_reruns"][-1]["rank"] == expected["rank"], saw
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[1 - expected["rank"]]["status"] == "consequence", saw


@pytest.fixture(scope="module")
def cuda_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    ports: set[int] = set()
    while len(ports) < len(CASES):  # one rendezvous port each: the jobs run side by side
        ports.add(free_port())
    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        jobs = {
            name: pool.submit(record_cuda, tmp_path_factory.mktemp(name), name, port=port)
            for name, port in zip(CASES, sorted(ports), strict=True)
        }
        reports = {name: job.result() for name, job in jobs.items()}
    for name, report in reports.items():
        print(f"{name}: exit {report['_code']}, {report.get('localization')}\n{report['_stderr']}")
    return reports


@pytest.mark.parametrize("name", CASES)
def test_device_assert_on_one_rank_sharing_the_gpu_is_localized_to_that_rank(cuda_jobs, name):
    assert_cuda_truth(cuda_jobs[name], name)


def test_shrink_of_the_cuda_culprit_rank_is_a_verified_single_process_repro(cuda_jobs, tmp_path):
    report = cuda_jobs["ddp_grown_vocab"]
    job = Path(report["run_dir"])
    done = reprocut(job.parent.parent.parent, "shrink", "--json", str(job), "--timeout", "90")
    assert done.returncode == ExitCode.OK, done.stderr[-4000:] + what_ranks_saw(report)
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
