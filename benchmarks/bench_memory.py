"""Out of memory: the corpus/memory cases recorded one at a time, each checked against its
case.toml, and each one's report.md made (`shrink`: a verified repro.py for the op-level ones,
exit 9 with report.md alone for those that failed because memory was held).

    python benchmarks/bench_memory.py [--device cuda] [--budget 330] [--out benchmarks/results]
                                      [--cases NAME ...] [--overhead]

Per case: the report within its bound (the plain run's time, one rerun and 30 s, as record
measured them; and the case's own `bound_s`), the op, step and phase (the recompute of a
checkpointed block named as such), the forward line of a backward op or the line of any other,
the request and why, the cause (the request alone vs memory held), holders summing to the
allocator's figure (what no recorded op made, "untracked", under 5% of allocated), the
allocator's figure agreeing with the error's own, a leak only where there is one (its retaining
variable and fix), the variable that holds the memory where the case names one, the picture,
the allocator snapshot and fragmentation on CUDA, report.md's memory section. `--overhead` adds
record's overhead on a GPU-bound loop (benchmarks/bench_record.py measures it too). Writes
memory-<device>.md and .json with the machine, date and command, after every case.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomllib

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.bench_record import device_name, overhead  # noqa: E402
from reprocut.model.oom import allocated_in_message, figures_agree  # noqa: E402

CORPUS = HERE.parent / "corpus" / "memory"
SLACK_S = 30  # the bound: the plain run, one rerun and 30 s
START_S = 15  # reprocut's own start and the parent's torch import, beside the runs


def _run(command: list[str], cwd: Path, timeout: float) -> tuple[int | None, str, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return None, out, f"timed out after {timeout:g} s", time.perf_counter() - start
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - start


def allocator_agrees(message: str, allocated: int | None) -> bool | None:
    """The failure's allocated bytes against the figure in CUDA's own message (None: the
    message gives none)."""
    said = allocated_in_message(message)
    if said is None or allocated is None:
        return None
    return figures_agree(said, allocated)


def check_memory(truth: dict[str, Any], report: dict[str, Any], device: str) -> dict[str, bool]:
    """record's JSON against the case's ground truth."""
    memory = report.get("memory") or {}
    checks: dict[str, bool] = {}
    if report.get("status") == "passed":  # `record --memory` of a run that did not fail
        return {**_leak_checks(truth, memory), "plot": _exists(memory.get("plot"))}
    for key in ("op", "step", "phase"):
        if key in truth:
            checks[key] = report.get(key) == truth[key]
    if "phase_detail" in truth:
        checks["phase detail"] = (memory.get("phase") or "").startswith(truth["phase_detail"])
    recompute = (memory.get("phase") or "").startswith("recompute")
    backward = report.get("phase") == "backward" and not recompute
    line = report.get("forward_source") if backward else report.get("source")
    checks["line"] = bool(line) and Path(line["file"]).name == truth["file"]
    checks["cause"] = memory.get("cause") == truth["cause"]
    if "requested_bytes" in truth:
        asked = memory.get("requested_bytes") or 0
        checks["request"] = abs(asked - truth["requested_bytes"]) < 0.01 * asked + 1
    for sentence in truth.get("why", ()):
        checks[f"why: {sentence[:30]}"] = any(sentence in w for w in memory.get("why", ()))
    held, allocated = memory.get("held") or {}, memory.get("allocated_bytes")
    if allocated:
        checks["holders within 5%"] = held.get("untracked", 0) <= 0.05 * allocated
    agrees = allocator_agrees((report.get("error") or {}).get("message", ""), allocated)
    if agrees is not None:
        checks["allocated as the error says"] = agrees
    if "holder_role" in truth:
        checks["holder role"] = bool(held) and max(held, key=held.get) == truth["holder_role"]
    checks.update(_leak_checks(truth, memory))
    if "held_by" in truth:
        held_by = memory.get("held_by") or {}
        checks["held by"] = (held_by.get("retainer") or [""])[0].startswith(f"`{truth['held_by']}`")
        checks["held by: fix"] = truth["held_by_fix"] in (held_by.get("fix") or "")
    checks["plot"] = _exists(memory.get("plot"))
    if device == "cuda":
        checks["snapshot"] = _exists(memory.get("snapshot"))
        if report.get("status") != "passed":  # the allocator's cache is read at the failure
            checks["fragmentation"] = bool((memory.get("fragmentation") or {}).get("text"))
    checks["no stage skipped"] = not memory.get("skipped")
    return checks


def _rerun_failure(run_dir: Path) -> dict[str, Any]:
    """memory.json's failure, as the memory rerun took it ({} without one)."""
    try:
        return json.loads((run_dir / "memory.json").read_text()).get("failure") or {}
    except (OSError, ValueError):
        return {}


def _exists(path: str | None) -> bool:
    return bool(path) and Path(path).exists()


def _leak_checks(truth: dict[str, Any], memory: dict[str, Any]) -> dict[str, bool]:
    """A leak only where there is one; where there is, its retaining variable and fix."""
    checks = {}
    leak = memory.get("leak") or {}
    if "leak" in truth:
        checks["leak only where there is one"] = bool(leak) == truth["leak"]
    if "retainer" in truth:
        retainer = leak.get("retainer") or [""]
        checks["retainer"] = retainer[0].startswith(f"`{truth['retainer']}`")
        checks["fix"] = truth["fix"] in (leak.get("fix") or "")
    return checks


def within_bound(truth: dict[str, Any], run_dir: Path, seconds: float) -> dict[str, bool]:
    """The report within the plain run's time, one rerun and 30 s (record's own first run and
    memory rerun, as meta.json and the report give them), and within the case's bound_s."""
    meta = json.loads((run_dir / "meta.json").read_text())
    memory = json.loads((run_dir / "failure.json").read_text()).get("memory") or {}
    rerun = (memory.get("seconds") or {}).get("memory rerun", 0.0)
    first = float(meta.get("seconds") or 0.0)
    checks = {"report within run + rerun + 30 s": seconds <= first + rerun + SLACK_S + START_S}
    if "bound_s" in truth:
        checks[f"report within {truth['bound_s']} s"] = seconds <= truth["bound_s"]
    return checks


def shrink_case(
    truth: dict[str, Any], run_dir: str, workdir: Path
) -> tuple[dict[str, bool], dict[str, Any]]:
    """`shrink`: the op-level repro verified, or exit 9 with report.md; report.md's memory
    section either way."""
    command = [sys.executable, "-m", "reprocut", "shrink", "--json", "--runs", "2", run_dir]
    if truth.get("repro"):
        command[5:5] = ["--max-time", "40"]
    code, out, err, seconds = _run(command, workdir, 180)
    try:
        shrunk = json.loads(out)
    except json.JSONDecodeError:
        shrunk = {"status": f"exit {code}", "stderr": err[-500:]}
    checks = {}
    if truth.get("repro"):
        checks["repro verified"] = shrunk.get("status") == "verified"
        checks["repro on empty inputs"] = shrunk.get("path") == "empty-inputs"
        report_md = Path(shrunk.get("report") or Path(run_dir) / "report.md")
    else:
        checks["shrink says held (exit 9)"] = code == 9
        report_md = Path(run_dir) / "report.md"
    text = report_md.read_text() if report_md.exists() else ""
    checks["report.md: memory section"] = "## Out of memory" in text
    if "retainer" in truth:
        checks["report.md: retainer path"] = f"`{truth['retainer']}`" in text
    if "held_by" in truth:
        checks["report.md: held by"] = f"`{truth['held_by']}`" in text
    info = {"shrink": shrunk.get("status"), "shrink_path": shrunk.get("path"),
            "shrink_seconds": round(seconds, 1), "report_md": str(report_md)}  # fmt: skip
    return checks, info


def record_case(case: Path, device: str, workdir: Path, timeout: int) -> dict[str, Any]:
    truth = tomllib.loads((case / "case.toml").read_text())["memory"]
    options = ["--memory"] if device in truth.get("memory_option_on", ()) else []
    command = [sys.executable, "-m", "reprocut", "record", "--json", "--quiet",
               "--timeout", str(timeout), *options, str(case / "train.py"), "--device", device]  # fmt: skip
    code, out, err, seconds = _run(command, workdir, timeout * 3 + 60)
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        return {"case": case.name, "ok": False, "seconds": round(seconds, 1), "error": err[-1500:]}
    if "run_dir" not in report:  # record's own error object: a timeout, a crash, a bad launch
        return {"case": case.name, "ok": False, "seconds": round(seconds, 1), "exit": code,
                "error": f"{report.get('status')}: {report.get('message')}", "stderr": err[-1500:]}  # fmt: skip
    run_dir = workdir / report["run_dir"]
    checks = check_memory(truth, report, device)
    if report.get("status") != "passed":
        checks.update(within_bound(truth, run_dir, seconds))
        shrink_checks, shrink_info = shrink_case(truth, str(run_dir), workdir)
        checks.update(shrink_checks)
    else:
        shrink_info = {}
    memory = report.get("memory") or {}
    rerun = _rerun_failure(run_dir)
    return {
        "case": case.name,
        "seconds": round(seconds, 1),
        "exit": code,
        "op": report.get("op"),
        "step": report.get("step"),
        "phase": report.get("phase"),
        "memory_phase": memory.get("phase"),
        "requested_bytes": memory.get("requested_bytes"),
        "why": memory.get("why"),
        "held": memory.get("held"),
        "allocated_bytes": memory.get("allocated_bytes"),
        "leak": memory.get("leak"),
        "evidence": memory.get("evidence"),
        "held_by": memory.get("held_by"),
        "skipped": memory.get("skipped"),
        "analysis_seconds": memory.get("seconds"),
        "run_dir": str(run_dir),
        "source": report.get("source"),
        "forward_source": report.get("forward_source"),
        "message": (report.get("error") or {}).get("message", "")[:400],
        # the memory rerun's own error: its allocated figure is the one the watch read against
        "rerun_allocated_said": allocated_in_message(rerun.get("error") or ""),
        "rerun_allocated_read": rerun.get("allocated"),
        **shrink_info,
        "checks": checks,
        "ok": all(checks.values()),
    }


def render(meta: dict[str, Any], cases: list[dict[str, Any]], cost: dict[str, Any]) -> str:
    lines = [
        f"# Out of memory on {meta['device_name']} ({meta['date']})",
        "",
        f"torch {meta['torch']}, commit {meta['commit']}, command: `{meta['command']}`",
        "",
        "| case | op | step/phase | asked | record s | shrink | ok | failed checks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        failed = [k for k, v in (c.get("checks") or {}).items() if not v]
        asked = c.get("requested_bytes")
        asked_text = f"{asked / 2**30:.2f} GiB" if asked else "-"
        phase = c.get("memory_phase") or c.get("phase")
        lines.append(
            f"| {c['case']} | {c.get('op')} | {c.get('step')} {phase} | {asked_text} | "
            f"{c.get('seconds')} | {c.get('shrink') or '-'} | {c.get('ok')} | "
            f"{', '.join(failed) or c.get('error', '')[:80]} |"
        )
    lines += ["", "why, growth, leak, held by, per case:", ""]
    for c in cases:
        lines.append(
            f"- {c['case']}: {c.get('why')}; growth: {(c.get('evidence') or {}).get('reason')}; "
            f"leak: {(c.get('leak') or {}).get('text')}; held by: "
            f"{(c.get('held_by') or {}).get('text')}; analysis: {c.get('analysis_seconds')}; "
            f"allocated at the failure: {_mib(c.get('rerun_allocated_read'))} read in the memory "
            f"rerun, {_mib(c.get('rerun_allocated_said'))} in the rerun's own error, "
            f"{_mib(allocated_in_message(c.get('message') or ''))} in the failing run's"
        )
    if cost:
        lines += ["", "## record overhead when nothing fails (gpu_bound loop, medians)", ""]
        lines.append(
            f"loop ratio {cost.get('loop_ratio', 0):.3f}x (plain {cost.get('plain_loop_s')} s, "
            f"record {cost.get('record_loop_s')} s); whole run {cost.get('total_ratio', 0):.3f}x"
            if "loop_ratio" in cost
            else f"not measured: {cost.get('error')}"
        )
    return "\n".join(lines) + "\n"


def _mib(count: int | None) -> str:
    return "-" if count is None else f"{count / 2**20:.2f} MiB"


def _commit() -> str:
    import os

    found = os.environ.get("REPROCUT_COMMIT")
    if found:
        return found
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=HERE)  # fmt: skip
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="*", help="case names (default: all for the device)")
    parser.add_argument("--timeout", type=int, default=150, help="record's --timeout per run")
    parser.add_argument("--budget", type=float, default=None, help="no case starts after it (s)")
    parser.add_argument("--overhead", action="store_true", help="also record's overhead")
    parser.add_argument("--repeats", type=int, default=2, help="overhead repeats")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    options = parser.parse_args()
    cases = [
        p
        for p in sorted(CORPUS.iterdir())
        if (p / "case.toml").exists()
        and options.device in tomllib.loads((p / "case.toml").read_text())["devices"]
        and (not options.cases or p.name in options.cases)
    ]
    import torch

    meta = {
        "device_name": device_name(options.device),
        "torch": torch.__version__,
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "command": " ".join(["python benchmarks/bench_memory.py", *sys.argv[1:]]),
    }
    options.out.mkdir(parents=True, exist_ok=True)
    stem = options.out / f"memory-{options.device}"
    started, results, cost = time.monotonic(), [], {}

    def save() -> None:  # after every case: a stage cut off keeps what it measured
        data = {"meta": meta, "cases": results, "overhead": cost}
        stem.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str))
        stem.with_suffix(".md").write_text(render(meta, results, cost))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for case in cases:
            if options.budget is not None and time.monotonic() - started > options.budget:
                results.append({"case": case.name, "ok": False, "error": "not run: budget spent"})
                continue
            results.append(record_case(case, options.device, work, options.timeout))
            save()
            done = results[-1]
            failed = [k for k, v in (done.get("checks") or {}).items() if not v]
            print(f"{case.name}: ok={done['ok']} {done.get('seconds')} s failed={failed} "
                  f"{done.get('error', '')[:200]}", flush=True)  # fmt: skip
        if options.overhead:
            try:
                cost = overhead("gpu_bound.py", options.device, options.repeats, work)
            except (AssertionError, subprocess.SubprocessError) as exc:
                cost = {"error": str(exc)[-500:]}
    save()
    print(render(meta, results, cost))


if __name__ == "__main__":
    main()
