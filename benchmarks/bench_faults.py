"""Issue #11's GPU benchmark: the corpus's custom-kernel and library-error cases, crash to repro.

    python benchmarks/bench_faults.py --device cuda --jobs 8 --max-time 60 --out $OUT

Each case: `reprocut record` (scored against case.toml as run_corpus scores it), then, one after
the other and with the same time limit, `reprocut shrink` of that recording and the generic reducer
(shrinkray, as bench_source.py runs it: a fresh `python` per check, blocking launches) on the
script; one after the other so that neither's checks compete with the other's for the GPU and the
cores (`--beside`: both at once). Both results are then run
once more as plain `python repro.py` (no CUDA_LAUNCH_BLOCKING, from the folder it was written to)
and must fail with the case's CUDA signature. The table gives: localized right, verified, shrink
seconds, checks, repro lines and the compute-sanitizer finding shrink attached (memory errors),
then the generic reducer's columns; the median shrink time is printed. Writes OUT/faults-<device>.md
and .json (OUT: benchmarks/results by default; a rerun overwrites them), and copies each case's
repro.py, report.md, sanitizer.log and shrink's JSON and stderr to OUT/faults-<device>-repros/ as
<case>.py, <case>.report.md, <case>.sanitizer.log, <case>.shrink.json and <case>.shrink.stderr.
Results are rewritten after every case, so a run stopped by a time limit still leaves a table.
This process never touches CUDA.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import generic_reducer
from benchmarks.bench_source import SourceCase, fresh_signature, run_shrinkray
from benchmarks.corpus_cases import CORPUS, CorpusCase, load_cases
from benchmarks.corpus_score import CaseScore, RunOutput, score_case
from benchmarks.run_corpus import environment, record_command, run_json
from reprocut.model.case import Signature

CASES = (
    "cuda_triton_expand_bias",
    "cuda_triton_int32_offsets",
    "cuda_cupy_misaligned_vec4",
    "cuda_cupy_contiguous_pe",
    "cuda_cupy_hashed_ids",
    "cuda_cublas_lda_stride0",
    "cuda_cublas_transposed_keys",
    "gnn_sparse_adjacency",
)
LOCALIZED = ("outcome", "op", "line", "step", "signature")
# what shrink wrote -> the suffix of its copy, <case><suffix>, in the repros folder
COPIED = {"repro.py": ".py", "report.md": ".report.md", "sanitizer.log": ".sanitizer.log"}


@dataclass(frozen=True)
class Reduced:
    """One reducer's result on one case."""

    seconds: float | None = None
    reduce_seconds: float | None = None  # reprocut: the reduction alone (its `phases`)
    checks: int | None = None
    lines: int | None = None
    code_lines: int | None = None  # without the module docstring (reprocut's header)
    verified: bool | None = None  # a plain `python repro.py` failed with the case's signature
    status: str = ""
    runs: str = ""  # reprocut: its own plain verification runs, "3/3"
    sanitizer: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultRow:
    case: str
    family: str
    score: CaseScore
    reprocut: Reduced = field(default_factory=Reduced)
    generic: Reduced = field(default_factory=Reduced)

    @property
    def localized(self) -> bool:
        return all(getattr(self.score, name) is True for name in LOCALIZED)

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "family": self.family,
            "localized": self.localized,
            "score": self.score.to_json(),
            "reprocut": asdict(self.reprocut),
            "generic": asdict(self.generic),
        }


def count_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def count_code_lines(code: str) -> int | None:
    """Non-blank lines less the module docstring: the repro's header (what failed, where it
    was seen, compute-sanitizer's finding) is reprocut's report, not code a reader must follow."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return None
    lines = code.splitlines()
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        del lines[first.lineno - 1 : first.end_lineno]
    return count_lines("\n".join(lines))


def source_case(case: CorpusCase, device: str) -> SourceCase | None:
    """The case as bench_source.py's reducers take it: the script, its arguments (`--device`
    as record gets it) and the signature case.toml expects on `device`."""
    truth = case.truth(device)
    if truth.kind is None or (truth.error_code is None and truth.error_type is None):
        return None
    expected = Signature(truth.error_type or "RuntimeError", truth.error_code, None, truth.kind)
    return SourceCase(case.name, case.folder, expected, argv=(*case.args, "--device", device))


def plain_verified(script: Path, argv: tuple[str, ...], source: SourceCase, timeout: float) -> bool:
    """One plain `python script argv...` (no CUDA_LAUNCH_BLOCKING) fails with the signature."""
    seen = fresh_signature(script, argv, timeout, blocking=False)
    return seen is not None and seen.matches(source.expected)


def shrink_command(run_dir: str, out: Path, max_time: float, timeout: float) -> list[str]:
    return [sys.executable, "-m", "reprocut", "shrink", "--json", "--out", str(out),
            "--max-time", str(int(max_time)), "--timeout", str(int(timeout)), run_dir]  # fmt: skip


def run_reprocut_shrink(
    run_dir: str, scratch: Path, source: SourceCase | None, options: argparse.Namespace
) -> tuple[RunOutput, Reduced]:
    out = scratch / "repro"
    limit = options.max_time + options.tail
    shrunk = run_json(
        shrink_command(run_dir, out, options.max_time, options.check_timeout), scratch, limit
    )
    data = shrunk.data or {}
    repro = out / "repro.py"
    code = repro.read_text() if repro.exists() else None
    runs = data.get("verified")
    runs_text = f"{runs.get('reproduced')}/{runs.get('runs')}" if isinstance(runs, dict) else ""
    verified = None
    if repro.exists() and source is not None:
        verified = plain_verified(repro, (), source, options.check_timeout * 2)
    status = "killed at the harness limit" if shrunk.timed_out else str(data.get("status", "?"))
    phases = data.get("phases") or {}
    reduce = phases.get("source_reduce", phases.get("shrink"))
    return shrunk, Reduced(
        seconds=round(shrunk.seconds, 1),
        reduce_seconds=None if reduce is None else round(reduce, 1),
        checks=data.get("checks"),
        lines=None if code is None else count_lines(code),
        code_lines=None if code is None else count_code_lines(code),
        verified=verified,
        status=status,
        runs=runs_text,
        sanitizer=data.get("sanitizer") or {},
    )


def run_generic(source: SourceCase | None, scratch: Path, options: argparse.Namespace) -> Reduced:
    if source is None:
        return Reduced(status="no signature for this device in case.toml")
    if not options.generic:
        return Reduced(status="not run (--no-generic)")
    if not generic_reducer.installed():
        return Reduced(status="shrinkray not installed")
    work = scratch / "generic" / "case"
    shutil.copytree(source.folder, work, ignore=shutil.ignore_patterns("__pycache__", ".reprocut"))
    outcome = run_shrinkray(source, work, options.max_time, options.check_timeout)
    verified = None
    if outcome.code:
        reduced = work / source.script
        reduced.write_text(outcome.code)
        verified = plain_verified(reduced, source.argv, source, options.check_timeout * 2)
    return Reduced(
        seconds=round(outcome.seconds, 1),
        checks=outcome.checks,
        lines=outcome.lines or None,
        code_lines=count_code_lines(outcome.code) if outcome.code else None,
        verified=verified,
        status=outcome.status,
    )


def bench_case(case: CorpusCase, root: Path, options: argparse.Namespace) -> FaultRow:
    """Record, then shrink and the generic reducer side by side, each then run plainly."""
    scratch = root / case.name
    scratch.mkdir(parents=True, exist_ok=True)
    record = run_json(
        record_command(case, options.device, [], options.record_timeout),
        scratch,
        options.record_timeout + 30,
    )
    source = source_case(case, options.device)
    run_dir = (record.data or {}).get("run_dir")
    if not (run_dir and record.returncode == 0):
        return FaultRow(case.name, case.family, score_case(case, options.device, record))
    run_dir = str((scratch / run_dir).resolve())
    with ThreadPoolExecutor(max_workers=1) as pool:
        generic = pool.submit(run_generic, source, scratch, options) if options.beside else None
        shrunk, reduced = run_reprocut_shrink(run_dir, scratch, source, options)
        row = FaultRow(
            case.name,
            case.family,
            score_case(case, options.device, record, shrunk),
            reduced,
            generic.result() if generic else run_generic(source, scratch, options),
        )
    keep = repros_folder(options.out, options.device)
    keep.mkdir(parents=True, exist_ok=True)
    for name, suffix in COPIED.items():
        if (scratch / "repro" / name).exists():
            shutil.copyfile(scratch / "repro" / name, keep / f"{case.name}{suffix}")
    # which passes were accepted, and shrink's last words: why a repro is as large as it is
    (keep / f"{case.name}.shrink.json").write_text(json.dumps(shrunk.data, indent=1, default=str))
    (keep / f"{case.name}.shrink.stderr").write_text(shrunk.stderr_tail)
    return row


# --- the table -------------------------------------------------------------------------------

MARK = {True: "✓", False: "✗", None: "·"}


def sanitizer_cell(row: FaultRow) -> str:
    evidence = row.reprocut.sanitizer
    if not evidence:
        memory = (row.score.got.get("kind") or "").lower()
        if "illegal memory" in memory or "misaligned" in memory:
            return "✗ none attached"
        return "· (not a memory error)"
    if evidence.get("status") == "found":
        findings = evidence.get("findings") or []
        return "✓ " + "; ".join(findings[:2]).replace("|", "/")
    return f"{evidence.get('status')}: {evidence.get('note', '')}".replace("|", "/")


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 1) if present else None


def _seconds(value: float | None) -> str:
    return "·" if value is None else f"{value} s"


def render(rows: list[FaultRow], meta: dict[str, Any]) -> str:
    r_median = _median([r.reprocut.seconds for r in rows])
    g_median = _median([r.generic.seconds for r in rows])
    lines = [
        f"# Fault classes on {meta.get('device_name', '?')}: record + shrink vs a generic reducer",
        "",
        f"- {meta['date']}, torch {meta.get('torch', '?')}, Python {meta.get('python', '?')}, "
        f"commit {meta.get('commit', '?')}, wall time {meta.get('wall_seconds', '?')} s"
        + (f" ({meta['incomplete']})" if meta.get("incomplete") else ""),
        f"- command: `{meta['command']}`",
        f"- time limit {meta['max_time']:.0f} s per case for each reducer (`shrink --max-time`, "
        f"shrinkray killed at it), {meta['check_timeout']:.0f} s per check, "
        f"{meta.get('jobs', '?')} cases at once; generic reducer: "
        f"shrinkray {meta.get('generic_version', '?')}",
        f"- each case's repro.py, compute-sanitizer log and shrink JSON: "
        f"`{repros_folder(Path('.'), meta['device']).name}/`",
        "",
        "`localized`: outcome, op (kernel), line, step and signature all right (case.toml). "
        "`verified`: the repro, run once more as a plain `python repro.py` (no "
        "CUDA_LAUNCH_BLOCKING) from where it was written, failed with case.toml's signature; "
        "in brackets shrink's own plain runs. `shrink s`: wall time of `reprocut shrink` (fork "
        "server, the script's probe runs, reduction, verification, compute-sanitizer, report); "
        "`reduce s`: the reduction alone. `lines`: non-blank lines of "
        "repro.py, its header included (statements in brackets); `code`: the same less the "
        "module docstring (reprocut's header: what failed, where, compute-sanitizer's finding).",
        "",
        "| case | localized | facts | verified | shrink s | reduce s | checks | lines | code "
        "| compute-sanitizer | generic verified | generic s | generic checks | generic lines "
        "| notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        r, g = row.reprocut, row.generic
        runs = f" ({r.runs})" if r.runs else ""
        statuses = [s for s in (r.status, g.status) if s and s not in ("verified", "finished")]
        notes = "; ".join([*row.score.notes, *statuses])
        statements = f" ({row.score.statements})" if row.score.statements is not None else ""
        lines.append(
            f"| {row.case} | {MARK[row.localized]} | {MARK[row.score.facts]} | "
            f"{MARK[r.verified]}{runs} | {MARK[None] if r.seconds is None else r.seconds} | "
            f"{MARK[None] if r.reduce_seconds is None else r.reduce_seconds} | "
            f"{MARK[None] if r.checks is None else r.checks} | "
            f"{MARK[None] if r.lines is None else r.lines}{statements} | "
            f"{MARK[None] if r.code_lines is None else r.code_lines} | {sanitizer_cell(row)} | "
            f"{MARK[g.verified]} | {MARK[None] if g.seconds is None else g.seconds} | "
            f"{MARK[None] if g.checks is None else g.checks} | "
            f"{MARK[None] if g.lines is None else g.lines} | {notes.replace('|', '/')} |"
        )
    done = [row for row in rows if row.reprocut.verified]
    lines += [
        "",
        f"**Median shrink time: reprocut {_seconds(r_median)} (reduction alone "
        f"{_seconds(_median([r.reprocut.reduce_seconds for r in rows]))}), generic reducer "
        f"{_seconds(g_median)}.** "
        f"Localized right {sum(r.localized for r in rows)}/{len(rows)}, verified repros "
        f"{len(done)}/{len(rows)} (generic {sum(bool(r.generic.verified) for r in rows)}), "
        f"compute-sanitizer findings "
        f"{sum(r.reprocut.sanitizer.get('status') == 'found' for r in rows)}.",
    ]
    found = [row for row in rows if row.reprocut.sanitizer.get("findings")]
    if found:
        lines += ["", "## compute-sanitizer findings attached by shrink", ""]
        for row in found:
            lines += [f"### {row.case}", "", "```", *row.reprocut.sanitizer["findings"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def repros_folder(out: Path, device: str) -> Path:
    """Where each case's repro and shrink output are copied: beside the table, one name per device."""
    return out / f"faults-{device}-repros"


def write(rows: list[FaultRow], meta: dict[str, Any], out: Path) -> Path:
    """faults-<device>.md and .json in `out`, overwriting the last run's (the date is inside)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"faults-{meta['device']}"
    (out / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "cases": [row.to_json() for row in rows]}, indent=1) + "\n"
    )
    markdown = out / f"{stem}.md"
    markdown.write_text(render(rows, meta))
    return markdown


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--cases", nargs="*", default=list(CASES), help="corpus case names")
    parser.add_argument("--jobs", type=int, default=8, help="cases at once")
    parser.add_argument("--max-time", type=float, default=60, help="seconds per case per reducer")
    parser.add_argument("--check-timeout", type=float, default=30, help="seconds per check")
    parser.add_argument("--record-timeout", type=float, default=180)
    parser.add_argument(
        "--beside", action="store_true", help="run the generic reducer beside reprocut's shrink"
    )
    parser.add_argument(
        "--tail", type=float, default=240, help="seconds shrink may take past --max-time"
    )
    parser.add_argument("--no-generic", dest="generic", action="store_false")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    wanted = set(options.cases)
    cases = [c for c in load_cases(options.corpus) if c.name in wanted]
    cases = [c for c in cases if c.applies_to(options.device)]
    started = time.perf_counter()
    meta: dict[str, Any] = {
        "device": options.device,
        "date": dt.date.today().isoformat(),
        "command": " ".join(["python benchmarks/bench_faults.py", *(argv or sys.argv[1:])]),
        "max_time": options.max_time,
        "check_timeout": options.check_timeout,
        "jobs": options.jobs,
        "generic_version": generic_reducer.version() if options.generic else "(not run)",
        **environment(options.device),
    }
    rows: list[FaultRow] = []
    lock = threading.Lock()
    root = Path(tempfile.mkdtemp(prefix="reprocut-faults-"))

    def one(case: CorpusCase) -> FaultRow:
        try:
            row = bench_case(case, root, options)
        except Exception as exc:  # a row that says so, not a lost benchmark
            empty = CaseScore(case.name, options.device, case.expect, notes=(f"harness: {exc!r}",))
            row = FaultRow(case.name, case.family, empty)
        print(f"{case.name}: localized {row.localized}, verified {row.reprocut.verified}, "
              f"shrink {row.reprocut.seconds} s", file=sys.stderr, flush=True)  # fmt: skip
        with lock:
            rows.append(row)
            partial = {**meta, "wall_seconds": round(time.perf_counter() - started, 1)}
            if len(rows) < len(cases):
                partial["incomplete"] = f"{len(rows)} of {len(cases)} cases"
            write(sorted(rows, key=lambda r: r.case), partial, options.out)
        return row

    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        done = list(pool.map(one, cases))
    shutil.rmtree(root, ignore_errors=True)  # what matters was copied to the repros folder
    meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    markdown = write(sorted(done, key=lambda r: r.case), meta, options.out)
    print(markdown.read_text())
    print(f"wrote {markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
