"""Out of memory on the GPU: the corpus/memory cases recorded (and the op-level ones shrunk),
each checked against its case.toml, plus the normal record path's overhead on a GPU-bound loop.

    python benchmarks/bench_memory.py [--device cuda] [--repeats 3] [--out benchmarks/results]

Per case: the op, step and phase (a backward op's forward line in the marked file), the request
and why, the cause (the request alone vs memory held), holders summing to the allocator's
figure (what no recorded op made, "untracked", under 5% of allocated), the leak's retaining
variable and line, the picture and the allocator snapshot written; for op-level cases, `shrink`
verifies a repro.py. Writes memory-<device>.md and .json with the machine, date and command.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tomllib

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.bench_record import device_name, overhead  # noqa: E402

CORPUS = HERE.parent / "corpus" / "memory"


def record_case(
    case: Path, device: str, workdir: Path, timeout: int, keep: Path | None = None
) -> dict[str, Any]:
    truth = tomllib.loads((case / "case.toml").read_text())
    memory_truth = truth["memory"]
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprocut",
            "record",
            "--json",
            "--quiet",
            "--timeout",
            str(timeout),
            str(case / "train.py"),
            "--device",
            device,
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout * 3,
    )
    seconds = time.perf_counter() - start
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"case": case.name, "ok": False, "seconds": seconds, "error": done.stderr[-1500:]}
    if "run_dir" not in report:  # record's own error object: a timeout, a crash, a bad launch
        return {
            "case": case.name,
            "ok": False,
            "seconds": round(seconds, 1),
            "exit": done.returncode,
            "error": f"{report.get('status')}: {report.get('message')}",
            "stderr": done.stderr[-1500:],
        }
    if keep is not None:  # record's JSON and the memory watch's findings, for a failed check
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{case.name}.record.json").write_text(done.stdout)
        watch = workdir / report["run_dir"] / "memory.json"
        if watch.exists():
            shutil.copyfile(watch, keep / f"{case.name}.memory.json")
    memory = report.get("memory") or {}
    checks = {}
    for key in ("op", "step", "phase"):
        if key in memory_truth:
            checks[key] = report.get(key) == memory_truth[key]
    line = (
        report.get("forward_source") if report.get("phase") == "backward" else report.get("source")
    )
    checks["file"] = bool(line) and Path(line["file"]).name == memory_truth["file"]
    checks["cause"] = memory.get("cause") == memory_truth["cause"]
    if "requested_bytes" in memory_truth:
        asked = memory.get("requested_bytes") or 0
        checks["request"] = abs(asked - memory_truth["requested_bytes"]) < 0.01 * asked + 1
    for sentence in memory_truth.get("why", ()):
        checks[f"why: {sentence[:30]}"] = any(sentence in w for w in memory.get("why", ()))
    held, allocated = memory.get("held") or {}, memory.get("allocated_bytes")
    if allocated:
        untracked = held.get("untracked", 0)
        checks["holders within 5%"] = untracked <= 0.05 * allocated
    if "holder_role" in memory_truth:
        checks["holder role"] = (
            bool(held) and max(held, key=held.get) == memory_truth["holder_role"]
        )
    if "retainer" in memory_truth:
        leak = memory.get("leak") or {}
        retainer = leak.get("retainer") or [""]
        checks["retainer"] = retainer[0].startswith(f"`{memory_truth['retainer']}`")
        checks["fix"] = memory_truth["fix"] in (leak.get("fix") or "")
    checks["plot"] = bool(memory.get("plot")) and Path(memory["plot"]).exists()
    checks["snapshot"] = bool(memory.get("snapshot")) and Path(memory["snapshot"]).exists()
    if report.get("status") != "passed":  # a failure on CUDA: the allocator's cache is read
        checks["fragmentation"] = bool((memory.get("fragmentation") or {}).get("text"))
    result = {
        "case": case.name,
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "op": report.get("op"),
        "step": report.get("step"),
        "phase": report.get("phase"),
        "requested_bytes": memory.get("requested_bytes"),
        "why": memory.get("why"),
        "held": held,
        "allocated_bytes": allocated,
        "leak": memory.get("leak"),
        "growth_per_step_bytes": memory.get("growth_per_step_bytes"),
        "run_dir": report.get("run_dir"),
        "fragmentation": memory.get("fragmentation"),
        "source": report.get("source"),
        "forward_source": report.get("forward_source"),
        "message": (report.get("error") or {}).get("message", "")[:400],
    }
    if memory_truth.get("repro"):
        shrink = subprocess.run(
            [
                sys.executable,
                "-m",
                "reprocut",
                "shrink",
                "--json",
                "--max-time",
                "40",
                report["run_dir"],
            ],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=300,
        )
        try:
            shrunk = json.loads(shrink.stdout)
        except json.JSONDecodeError:
            shrunk = {"status": f"exit {shrink.returncode}"}
        checks["repro verified"] = shrunk.get("status") == "verified"
        checks["repro on empty inputs"] = shrunk.get("path") == "empty-inputs"
        result["shrink"] = shrunk.get("status")
        result["shrink_path"] = shrunk.get("path")
        result["shrink_seconds"] = shrunk.get("seconds")
    else:
        shrink = subprocess.run(
            [sys.executable, "-m", "reprocut", "shrink", "--json", report["run_dir"]],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        checks["shrink says held (exit 9)"] = shrink.returncode == 9
    result["checks"] = checks
    result["ok"] = all(checks.values())
    return result


def render(meta: dict[str, Any], cases: list[dict[str, Any]], cost: dict[str, float]) -> str:
    lines = [
        f"# Out of memory on {meta['device_name']} ({meta['date']})",
        "",
        f"torch {meta['torch']}, command: `{meta['command']}`",
        "",
        "| case | op | step/phase | asked | s | ok | failed checks |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        failed = [k for k, v in (c.get("checks") or {}).items() if not v]
        asked = c.get("requested_bytes")
        asked_text = f"{asked / 2**30:.2f} GiB" if asked else "-"
        lines.append(
            f"| {c['case']} | {c.get('op')} | {c.get('step')} {c.get('phase')} | {asked_text} | "
            f"{c.get('seconds')} | {c.get('ok')} | {', '.join(failed) or c.get('error', '')[:80]} |"
        )
    lines += ["", "why / leak per case:", ""]
    for c in cases:
        lines.append(f"- {c['case']}: {c.get('why')}; leak: {(c.get('leak') or {}).get('text')}")
    lines += [
        "",
        "## record overhead when nothing fails (gpu_bound loop, medians)",
        "",
        f"loop ratio {cost.get('loop_ratio', 0):.3f}x (plain {cost.get('plain_loop_s')} s, "
        f"record {cost.get('record_loop_s')} s); whole run {cost.get('total_ratio', 0):.3f}x",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=150)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    options = parser.parse_args()
    cases = [
        p
        for p in sorted(CORPUS.iterdir())
        if (p / "case.toml").exists()
        and options.device in tomllib.loads((p / "case.toml").read_text())["devices"]
    ]
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        partial = options.out / f"memory-{options.device}.partial.jsonl"
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text("")
        results = []
        keep = options.out / f"memory-{options.device}-runs"
        with ThreadPoolExecutor(options.jobs) as pool:
            for result in pool.map(
                lambda c: record_case(c, options.device, work, options.timeout, keep), cases
            ):
                results.append(result)  # each case as it ends: a timeout keeps what was seen
                with partial.open("a") as sink:
                    sink.write(json.dumps(result, default=str) + "\n")
        try:  # the cases' figures are kept even when the overhead run fails
            cost = overhead("gpu_bound.py", options.device, options.repeats, work)
        except (AssertionError, subprocess.SubprocessError) as exc:
            cost = {"error": str(exc)[-500:]}
    meta = {
        "device_name": device_name(options.device),
        "torch": torch.__version__,
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python benchmarks/bench_memory.py", *sys.argv[1:]]),
    }
    options.out.mkdir(parents=True, exist_ok=True)
    stem = options.out / f"memory-{options.device}"
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "cases": results, "overhead": cost}, indent=2, default=str)
    )
    stem.with_suffix(".md").write_text(render(meta, results, cost))
    partial.unlink()
    print(render(meta, results, cost))


if __name__ == "__main__":
    main()
