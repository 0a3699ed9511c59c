"""The fault classes on the GPU at shrink's default settings: the same bug, verified, in a minute?

    python benchmarks/bench_faults.py --device cuda --jobs 3 --no-generic --out $OUT

All cases are recorded first (`--record-jobs` at once), then shrunk `--jobs` at a time. Each
case (every memory-fault and custom-op case of the corpus by default): `reprocut record`
(scored against case.toml as run_corpus scores it), then `reprocut shrink` of that recording at
its default settings (`--max-time` given: that limit instead), then the repro run once more as a
plain `python repro.py` (no CUDA_LAUNCH_BLOCKING, from the folder it was written to), which must
fail with the case's CUDA signature. Per case: localized right, verified, the same bug (shrink's
`same_bug`: the repro's memcheck fingerprint against the original's), the original's
fingerprint against case.toml's, shrink seconds, the limit that stopped it if one did; then the
medians and the settings shrink reported. With the generic reducer (shrinkray, as
bench_source.py runs it) after each shrink, on the same limit, unless `--no-generic`.
Writes OUT/faults-<device>.md and .json (OUT: benchmarks/results by default; a rerun overwrites
them), and copies each case's repro.py, report.md, sanitizer logs and shrink's JSON and stderr
to OUT/faults-<device>-repros/. Results are rewritten after every case, so a run stopped by a
time limit still leaves a table. This process never touches CUDA.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import generic_reducer
from benchmarks.bench_source import SourceCase, run_shrinkray
from benchmarks.corpus_audit import audit
from benchmarks.corpus_cases import CORPUS, CorpusCase, load_cases
from benchmarks.corpus_score import CaseScore, RunOutput, score_case, with_audit
from benchmarks.faults_table import (
    FaultRow,
    Reduced,
    matches_truth,
    previous_result,
    repros_folder,
    write,
)
from benchmarks.run_corpus import case_outputs, environment, record_command, run_json, use_tree
from reprocut.check.verify import run_plain
from reprocut.model.case import Signature
from reprocut.model.limits import SAFETY_CAP

CASES = (  # the memory faults and the custom ops (the cuBLAS status cases: --cases)
    "cuda_triton_expand_bias",
    "cuda_triton_int32_offsets",
    "cuda_triton_op_compiled",
    "cuda_cupy_misaligned_vec4",
    "cuda_cupy_contiguous_pe",
    "cuda_cupy_hashed_ids",
    "cuda_cupy_host_pointers",
    "cuda_extension_pad_rows",
    "cuda_triton_op_guarded",
    "cuda_extension_exit_guard",
    "gnn_sparse_adjacency",
)
# shrink's longest reduction at its defaults (to its fixed point, under the safety cap)
DEFAULT_LIMIT = SAFETY_CAP
GENERIC_LIMIT = 120.0  # the generic reducer's, without --max-time
# what shrink wrote -> the suffix of its copy, <case><suffix>, in the repros folder
COPIED = {"repro.py": ".py", "report.md": ".report.md", "sanitizer.log": ".sanitizer.log",
          "sanitizer-original.log": ".sanitizer-original.log",
          "repro-refused.py": ".refused.py"}  # fmt: skip


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


def repro_run(
    repro: Path, source: SourceCase, timeout: float, argv: tuple[str, ...] = ()
) -> tuple[bool, str]:
    """`python repro.py argv...` as a user runs it (its own interpreter, teardown and all, no
    CUDA_LAUNCH_BLOCKING): does it fail with the signature; if not, what it did instead."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    outcome = run_plain(repro, argv=argv, timeout=timeout, env=env)
    if outcome.signature is not None and outcome.signature.matches(source.expected):
        return True, ""
    ended = "timed out" if outcome.returncode is None else f"exit {outcome.returncode}"
    seen = outcome.signature.describe() if outcome.signature else "no failure signature"
    return False, f"{ended}, {seen}; stderr ends: {outcome.stderr_tail[-600:]}"


def shrink_command(run_dir: str, out: Path, max_time: float | None) -> list[str]:
    """`reprocut shrink`, at its defaults unless a limit is given."""
    limit = [] if max_time is None else ["--max-time", str(int(max_time))]
    return [sys.executable, "-m", "reprocut", "shrink", "--json", "--out", str(out), *limit,
            run_dir]  # fmt: skip


def run_reprocut_shrink(
    run_dir: str, scratch: Path, source: SourceCase | None, options: argparse.Namespace
) -> tuple[RunOutput, Reduced]:
    out = scratch / "repro"
    limit = (options.max_time or DEFAULT_LIMIT) + options.tail
    log = None if options.logs is None else options.logs / f"{scratch.name}.shrink.log"
    shrunk = run_json(shrink_command(run_dir, out, options.max_time), scratch, limit, log)
    data = shrunk.data or {}
    repro = out / "repro.py"
    code = repro.read_text() if repro.exists() else None
    runs = data.get("verified")
    runs_text = f"{runs.get('reproduced')}/{runs.get('runs')}" if isinstance(runs, dict) else ""
    verified, plain_note = None, ""
    if repro.exists() and source is not None:
        verified, plain_note = repro_run(repro, source, options.check_timeout * 2)
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
        same_bug=data.get("same_bug") or {},
        stopped=str(data.get("stopped") or ""),
        limits=data.get("limits") or {},
        plain_note=plain_note,
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
    outcome = run_shrinkray(source, work, options.max_time or GENERIC_LIMIT, options.check_timeout)
    verified = None
    if outcome.code:
        reduced = work / source.script
        reduced.write_text(outcome.code)
        verified, _ = repro_run(reduced, source, options.check_timeout * 2, argv=source.argv)
    return Reduced(
        seconds=round(outcome.seconds, 1),
        checks=outcome.checks,
        lines=outcome.lines or None,
        code_lines=count_code_lines(outcome.code) if outcome.code else None,
        verified=verified,
        status=outcome.status,
    )


def record_case(case: CorpusCase, root: Path, options: argparse.Namespace) -> tuple[RunOutput, str]:
    """`reprocut record` of the case, in a scratch folder of its own: the run and its run folder
    ("" when the recording did not end in one)."""
    scratch = root / case.name
    scratch.mkdir(parents=True, exist_ok=True)
    record = run_json(
        record_command(case, options.device, [], options.record_timeout),
        scratch,
        options.record_timeout + 30,
        None if options.logs is None else options.logs / f"{case.name}.record.log",
    )
    run_dir = (record.data or {}).get("run_dir")
    if not (run_dir and record.returncode == 0):
        return record, ""
    return record, str((scratch / run_dir).resolve())


def bench_case(
    case: CorpusCase, root: Path, options: argparse.Namespace, recorded: tuple[RunOutput, str]
) -> FaultRow:
    """Shrink the recording and the generic reducer side by side, each then run plainly."""
    scratch = root / case.name
    record, run_dir = recorded
    source = source_case(case, options.device)
    if not run_dir:
        return FaultRow(case.name, case.family, score_case(case, options.device, record))
    with ThreadPoolExecutor(max_workers=1) as pool:
        generic = pool.submit(run_generic, source, scratch, options) if options.beside else None
        shrunk, reduced = run_reprocut_shrink(run_dir, scratch, source, options)
        # the facts audit of what record and shrink printed, as the corpus run reads it
        printed = case_outputs(record, shrunk, scratch)
        row = FaultRow(
            case.name,
            case.family,
            with_audit(
                score_case(case, options.device, record, shrunk),
                audit(case.audit, options.device, printed),
            ),
            reduced,
            generic.result() if generic else run_generic(source, scratch, options),
            truth=matches_truth(case.fingerprint, (reduced.same_bug or {}).get("original")),
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--cases", nargs="*", default=list(CASES), help="corpus case names")
    parser.add_argument("--tree", type=Path, default=None,
                        help="run reprocut from this checkout (e.g. `git archive COMMIT reprocut` "
                             "unpacked): an A/B of two commits in one call; name its commit in "
                             "REPROCUT_COMMIT")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=3, help="shrinks at once")
    parser.add_argument(
        "--record-jobs", type=int, default=None,
        help="recordings at once, all made before the first shrink (default: --jobs)",
    )  # fmt: skip
    parser.add_argument(
        "--max-time", type=float, default=None, help="shrink's limit (default: shrink's defaults)"
    )
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
    parser.add_argument(
        "--logs", type=Path, default=None,
        help="write each record's and shrink's stderr here as it runs, lines stamped in seconds",
    )  # fmt: skip
    return parser.parse_args(argv)


def _recorded(case: CorpusCase, root: Path, options: argparse.Namespace) -> tuple[RunOutput, str]:
    try:
        return record_case(case, root, options)
    except Exception as exc:  # the shrink phase reports it as the case's row
        return RunOutput(1, None, 0.0, f"harness: {exc!r}"), ""


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    if options.tree is not None:
        use_tree(options.tree)
    if options.logs is not None:
        options.logs.mkdir(parents=True, exist_ok=True)
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
        "record_jobs": options.record_jobs or options.jobs,
        "generic_version": generic_reducer.version() if options.generic else "(not run)",
        **environment(options.device),
    }
    previous = previous_result(options.out, options.device)  # before the partial writes
    rows: list[FaultRow] = []
    lock = threading.Lock()
    root = Path(tempfile.mkdtemp(prefix="reprocut-faults-"))

    # every recording first (side by side), then the shrinks, `--jobs` at a time: with --jobs 1
    # each shrink has the machine to itself, as a user's has
    print(f"recording {len(cases)} cases, {options.record_jobs or options.jobs} at once",
          file=sys.stderr, flush=True)  # fmt: skip
    with ThreadPoolExecutor(max_workers=max(1, options.record_jobs or options.jobs)) as pool:
        recorded = pool.map(lambda case: _recorded(case, root, options), cases)
        recordings = {case.name: run for case, run in zip(cases, recorded, strict=True)}

    def one(case: CorpusCase) -> FaultRow:
        try:
            row = bench_case(case, root, options, recordings[case.name])
        except Exception as exc:  # a row that says so, not a lost benchmark
            empty = CaseScore(case.name, options.device, case.expect, notes=(f"harness: {exc!r}",))
            row = FaultRow(case.name, case.family, empty)
        print(f"{case.name}: localized {row.localized}, verified {row.reprocut.verified}, "
              f"same bug {row.same_bug}, shrink {row.reprocut.seconds} s", file=sys.stderr,
              flush=True)  # fmt: skip
        with lock:
            rows.append(row)
            partial = {**meta, "wall_seconds": round(time.perf_counter() - started, 1)}
            if len(rows) < len(cases):
                partial["incomplete"] = f"{len(rows)} of {len(cases)} cases"
            write(sorted(rows, key=lambda r: r.case), partial, options.out, previous)
        return row

    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        done = list(pool.map(one, cases))
    shutil.rmtree(root, ignore_errors=True)  # what matters was copied to the repros folder
    meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    markdown = write(sorted(done, key=lambda r: r.case), meta, options.out, previous)
    print(markdown.read_text())
    print(f"wrote {markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
