"""Where a source reduction's checks spend their time on this machine.

A fixed-point reduction of a CuPy memory-fault script makes 100-175 checks; on the H200 with
four shrinks at once they averaged 1.4 s each. This splits that figure: (1) a probe script,
run through the fork server like a candidate, times its own CUDA start, kernel compile and
faulting launch, one check at a time and then with `--together` oracles at once; (2) one
corpus case is reduced to its fixed point with every check timed (start, end, slot, verdict),
and the checks are summed per pass and per verdict. Writes markdown (and the raw timings as
JSON) under --out.

    python benchmarks/check_timing.py --case cuda_cupy_contiguous_pe --out /tmp/timing
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_source import corpus_case, cpu_cases, with_probed_specs  # noqa: E402

from reprocut.check.oracle import Oracle  # noqa: E402
from reprocut.model.case import Signature  # noqa: E402
from reprocut.source.checks import OracleChecks  # noqa: E402
from reprocut.source.fixed_point import SourceReducer, signature_of  # noqa: E402
from reprocut.source.reducer import reduce_source  # noqa: E402

# A candidate-like script that reports its own phases in its error message.
PROBE = r'''
import time
t0 = time.perf_counter()
import torch
x = torch.empty(1, device="cuda")
t1 = time.perf_counter()
import cupy
k = cupy.RawKernel(r"""
extern "C" __global__ void probe_read(const float* x, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i + (1LL << 34)];
}
""", "probe_read")
k.compile()
t2 = time.perf_counter()
a = torch.randn(1 << 20, device="cuda")
out = torch.empty_like(a)
k((4096,), (256,), (cupy.asarray(a), cupy.asarray(out), cupy.int64(a.numel())))
try:
    torch.cuda.synchronize()
except Exception:
    pass
t3 = time.perf_counter()
raise RuntimeError(f"probe cuda={t1 - t0:.3f} compile={t2 - t1:.3f} fault={t3 - t2:.3f}")
'''
PROBE_SIGNATURE = Signature("RuntimeError", None, None, "probe cuda=<n> compile=<n> fault=<n>")


def probe_checks(oracle: Oracle, folder: Path, count: int) -> list[dict[str, float]]:
    """`count` probe checks one after the other through `oracle`: wall and phase seconds."""
    rows = []
    path = folder / "probe.py"
    path.write_text(PROBE)
    for _ in range(count):
        started = time.perf_counter()
        verdict = oracle.check_source(PROBE, filename=str(path), cwd=folder, argv=[],
                                      expected=PROBE_SIGNATURE, confirm=False)  # fmt: skip
        row = {"wall": time.perf_counter() - started}
        for part in (getattr(verdict, "message", "") or "").split()[1:]:
            name, _, value = part.partition("=")
            row[name] = float(value) if value.replace(".", "").isdigit() else -1.0
        rows.append(row)
    return rows


def probe(widths: list[int], count: int, work: Path) -> dict[str, Any]:
    """The probe with each of `widths` oracles at once (each oracle a check at a time, as a
    shrink of one slot would): every check's seconds, and the batch's wall time, whose checks
    per second say how many CUDA checks the machine runs a second at that width."""
    results: dict[str, Any] = {}
    for width in widths:
        oracles = [Oracle(PROBE_SIGNATURE, timeout=60) for _ in range(width)]
        try:
            folders = []
            for k, oracle in enumerate(oracles):
                folder = work / f"probe-{width}-{k}"
                folder.mkdir(parents=True)
                folders.append(folder)
                oracle.warm_up()
                probe_checks(oracle, folder, 1)  # the kernel cache warm, the server's imports
            started = time.perf_counter()
            with ThreadPoolExecutor(width) as pool:
                runs = list(
                    pool.map(
                        lambda of: probe_checks(*of, count), zip(oracles, folders, strict=True)
                    )
                )
            wall = time.perf_counter() - started
            rows = [row for rows in runs for row in rows]
            results[f"{width} at once"] = {"rows": rows, "seconds": round(wall, 3)}
        finally:
            for oracle in oracles:
                oracle.close()
    return results


class TimedChecks(OracleChecks):
    """OracleChecks that note each run's start, end, slot and the reducer's current pass."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self.reducer: SourceReducer | None = None
        self._lock = threading.Lock()

    def run(self, code: str, slot: int, ticket: Any) -> Any:
        begin = time.perf_counter() - self.started
        step = self.reducer.current_pass if self.reducer is not None else "original"
        verdict = super().run(code, slot, ticket)
        signature = signature_of(verdict)
        with self._lock:
            self.rows.append({
                "pass": step or "original", "slot": slot, "start": round(begin, 3),
                "seconds": round(time.perf_counter() - self.started - begin, 3),
                "verdict": type(verdict).__name__,
                "error": None if signature is None else f"{signature.error_type}: {signature.kind[:60]}",
            })  # fmt: skip
        return verdict


def reduce_timed(name: str, work: Path, slots: int | None) -> dict[str, Any]:
    """Reduce corpus case `name` to its fixed point, every check timed."""
    case = next((c for c in cpu_cases() if c.name == name), None) or corpus_case(name)
    if isinstance(case, str):
        raise SystemExit(case)
    case = with_probed_specs(case, 120)  # what reaches the failing call, as record's would
    folder = work / name
    shutil.copytree(case.folder, folder)
    timed: dict[str, TimedChecks] = {}

    def make_runner(oracle: Any, script: Path, **kwargs: Any) -> TimedChecks:
        timed["runner"] = TimedChecks(oracle, script, **kwargs)
        return timed["runner"]

    import reprocut.source.fixed_point as fixed_point
    import reprocut.source.reducer as reducer_module

    real_run = fixed_point.SourceReducer.run

    def run(self: SourceReducer) -> str:
        timed["runner"].reducer = self
        return real_run(self)

    reducer_module.OracleChecks = make_runner  # type: ignore[assignment,misc]
    fixed_point.SourceReducer.run = run  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        result = reduce_source(folder / case.script, cwd=folder, argv=list(case.argv),
                               expected=case.expected, focus=case.focus, parallel=slots,
                               specs=case.specs, named_specs=case.named_specs,
                               named_values=case.named_values,
                               message=case.message or None)  # fmt: skip
        seconds = time.perf_counter() - started
    finally:
        reducer_module.OracleChecks = OracleChecks  # type: ignore[misc]
        fixed_point.SourceReducer.run = real_run  # type: ignore[method-assign]
    return {
        "case": name,
        "seconds": round(seconds, 1),
        "checks": result.checks,
        "lines": result.lines,
        "statements": result.statements,
        "slots": result.parallel,
        "discarded": result.discarded,
        "stopped": result.stopped,
        "rows": timed["runner"].rows,
        "code": result.code,
    }


def summary(numbers: list[float]) -> str:
    if not numbers:
        return "·"
    return f"median {statistics.median(numbers):.2f}, max {max(numbers):.2f} (n={len(numbers)})"


def markdown(probed: dict[str, Any], reduced: dict[str, Any] | None) -> str:
    lines = ["# Check timing", "", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), ""]
    lines += ["## Probe checks (seconds)", "", "| | checks/s | wall | cuda | compile | fault |", "|---|---|---|---|---|---|"]  # fmt: skip
    for label, batch in probed.items():
        rows = batch["rows"]
        rate = f"{len(rows) / batch['seconds']:.2f}" if batch["seconds"] else "·"
        cells = [summary([r.get(k, -1.0) for r in rows]) for k in ("wall", "cuda", "compile", "fault")]  # fmt: skip
        lines.append(f"| {label} | {rate} | " + " | ".join(cells) + " |")
    if reduced is not None:
        rows = reduced["rows"]
        lines += ["", f"## {reduced['case']}: {reduced['checks']} checks, {reduced['seconds']} s, "
                  f"{reduced['lines']} lines ({reduced['statements']} statements), slots "
                  f"{reduced['slots']}, discarded {reduced['discarded']}, {reduced['stopped']}", ""]  # fmt: skip
        by_pass: dict[str, list[float]] = defaultdict(list)
        by_error: dict[str, list[float]] = defaultdict(list)
        for row in rows:
            by_pass[row["pass"]].append(row["seconds"])
            by_error[f"{row['verdict']} {row['error'] or ''}"].append(row["seconds"])
        lines += ["| pass | runs | seconds in all | per run |", "|---|---|---|---|"]
        for name, secs in by_pass.items():
            lines.append(f"| {name} | {len(secs)} | {sum(secs):.1f} | {summary(secs)} |")
        lines += ["", "| verdict | runs | seconds in all | per run |", "|---|---|---|---|"]
        for name, secs in sorted(by_error.items(), key=lambda kv: -sum(kv[1])):
            lines.append(f"| {name[:70]} | {len(secs)} | {sum(secs):.1f} | {summary(secs)} |")
        lines += ["", "```python", reduced["code"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--case", default=None, help="a corpus case to reduce, every check timed")
    parser.add_argument("--slots", type=int, default=None, help="candidates at once (default: reprocut's)")  # fmt: skip
    parser.add_argument("--together", default="1,16", help="oracles probing at once: widths, comma-separated")  # fmt: skip
    parser.add_argument("--count", type=int, default=4, help="probe checks per oracle")
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="check-timing-") as tmp:
        work = Path(tmp)
        widths = [int(w) for w in options.together.split(",")]
        probed = probe(widths, options.count, work) if options.count else {}
        reduced = reduce_timed(options.case, work, options.slots) if options.case else None
    (options.out / "check-timing.json").write_text(json.dumps({"probe": probed, "reduced": reduced}, indent=1))  # fmt: skip
    text = markdown(probed, reduced)
    (options.out / "check-timing.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
