"""Crash to verified repro, measured end to end: the whole pipeline on the corpus's single-op cases.

    python benchmarks/bench_pipeline.py --device cuda              # on the GPU machine (~5 min)
    python benchmarks/bench_pipeline.py --device cpu --cases lm_grown_vocab rl_dqn_gather

Per case, one after another in the same run (each command in its own scratch folder, with a
timeout and its own process group): the plain script (`python train.py`, the crash), a
`CUDA_LAUNCH_BLOCKING=1` rerun (what a user does today; it only names a line), `reprocut
record`, `reprocut shrink` of that recording with its phases, and `reprocut record --shrink`
(crash to verified repro.py in one command) with its phases. Medians at the bottom, against the
goals of issue #13. Cases whose turn would start past --budget seconds are listed as skipped,
so one device call stays within its limit. Writes benchmarks/results/pipeline-<device>.md and
.json (pipeline-<device>-<tag>.* with --tag) with the date, device, torch version and machine;
a rerun overwrites them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.corpus_cases import CorpusCase, load_cases
from benchmarks.corpus_score import RunOutput
from benchmarks.run_corpus import RESULTS, environment, run_json
from benchmarks.size_trend import Sized, read_previous, trend_lines

# Single aten ops that device-assert on CUDA (error 710), one per family: embedding, gather,
# 2-d NLL loss, NLL loss, scatter_add_.
DEFAULT_CASES = (
    "lm_grown_vocab",
    "rl_dqn_gather",
    "seg_void_255",
    "vision_label_shift",
    "gnn_degree_scatter",
)
PHASES = ("fork_server", "read", "first_check", "shrink", "cpu_check", "verify", "report")
GOALS = {  # issue #13
    "shrink_s": "≤ 8 s",
    "record_ratio": "≤ 1.3x the plain run",
    "crash_to_repro_over_plain_s": "≤ plain run + 10 s",
}


def single_op(case: CorpusCase, device: str) -> bool:
    """A case that fails in one aten op that device-asserts (case.toml: op, cuda error 710)."""
    truth = case.truth("cuda")
    return (
        case.expect == "fail"
        and case.applies_to(device)
        and "cuda" in case.devices
        and (case.op or "").startswith("aten::")
        and truth.error_code == 710
    )


def script_command(case: CorpusCase, device: str) -> list[str]:
    return [sys.executable, str(case.script), *case.args, "--device", device]


def reprocut_command(case: CorpusCase, device: str, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "reprocut", "record", "--json", "--quiet", *flags,
        *case.record_args, str(case.script), *case.args, "--device", device,
    ]  # fmt: skip


def timed_script(case: CorpusCase, device: str, scratch: Path, timeout: float, **env: str) -> float:
    """Wall seconds of the script itself (it fails: that is the crash being timed)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        return run_json(script_command(case, device), scratch, timeout).seconds
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def bench_case(case: CorpusCase, device: str, root: Path, timeout: float) -> dict[str, Any]:
    scratch = root / case.name
    (scratch / "two").mkdir(parents=True)
    (scratch / "one").mkdir()
    row: dict[str, Any] = {"case": case.name, "op": case.op}
    row["plain_s"] = timed_script(case, device, scratch, timeout)
    row["blocking_s"] = timed_script(case, device, scratch, timeout, CUDA_LAUNCH_BLOCKING="1")
    record = run_json(reprocut_command(case, device), scratch / "two", timeout)
    row.update(_record_figures(record, "record"))
    run_dir = (record.data or {}).get("run_dir")
    if record.returncode == 0 and run_dir:
        run_dir = str((scratch / "two" / run_dir).resolve())
        shrink = run_json(
            [sys.executable, "-m", "reprocut", "shrink", "--json", run_dir],
            scratch / "two",
            timeout,
        )
        row.update(_shrink_figures(shrink.data or {}, shrink, "shrink"))
    both = run_json(reprocut_command(case, device, "--shrink"), scratch / "one", timeout)
    row.update(_record_figures(both, "record_shrink"))
    row.update(_shrink_figures((both.data or {}).get("shrink") or {}, both, "record_shrink"))
    if row.get("shrink_s") is not None:
        row["record_then_shrink_s"] = row["record_s"] + row["shrink_s"]
    return row


def _record_figures(run: RunOutput, label: str) -> dict[str, Any]:
    data = run.data or {}
    figures: dict[str, Any] = {
        f"{label}_s": run.seconds,
        f"{label}_rc": run.returncode,
        f"{label}_status": data.get("status"),
        f"{label}_localization": data.get("localization"),
    }
    try:  # the script's recorded run, then finding the op (record's meta.json)
        meta = json.loads((Path(data["run_dir"]) / "meta.json").read_text())
    except (KeyError, OSError, ValueError):
        meta = {}
    figures[f"{label}_script_s"] = meta.get("seconds")
    figures[f"{label}_localize_s"] = meta.get("localize_seconds")
    # the script's run split: until its failure was known, then until its process had exited
    figures[f"{label}_failed_after_s"] = meta.get("failed_after_seconds")
    figures[f"{label}_exit_s"] = meta.get("exit_after_failure_seconds")
    if run.returncode is None:
        figures[f"{label}_status"] = "timeout"
    return figures


def _shrink_figures(result: dict[str, Any], run: RunOutput, label: str) -> dict[str, Any]:
    figures: dict[str, Any] = {
        f"{label}_verified": result.get("status"),
        f"{label}_checks": result.get("checks"),
        f"{label}_statements": result.get("statements"),
        f"{label}_phases": result.get("phases") or {},
        # the fork server's own start: its torch import and warm-up (why fork_server is long)
        f"{label}_server_phases": result.get("fork_server") or {},
        f"{label}_tail": "" if result else run.stderr_tail[-600:],
    }
    if label == "shrink":
        figures["shrink_s"] = run.seconds
    return figures


def run(options: argparse.Namespace, write: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    names = options.cases or list(DEFAULT_CASES)
    every = [c for c in load_cases() if single_op(c, options.device)]
    cases = every if names == ["all"] else [c for c in every if c.name in names]
    started = time.perf_counter()
    meta = {
        "date": dt.date.today().isoformat(),
        "device": options.device,
        **environment(options.device),
        "machine": f"{platform.platform(terse=True)}, {os.cpu_count()} CPUs",
        "load_at_start": round(os.getloadavg()[0], 2),  # others' work on a shared machine
        "command": "python benchmarks/bench_pipeline.py " + " ".join(sys.argv[1:]),
    }
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="reprocut-pipeline-") as tmp:
        for case in cases:
            elapsed = time.perf_counter() - started
            longest = max((row["case_s"] for row in rows), default=0.0)
            if rows and elapsed + longest > options.budget:
                rows.append({"case": case.name, "skipped": f"budget {options.budget:.0f} s"})
                continue
            case_started = time.perf_counter()
            runs = [
                bench_case(case, options.device, Path(tmp) / str(i), options.timeout)
                for i in range(options.repeats)
            ]
            row = median_row(runs)
            row["case_s"] = time.perf_counter() - case_started
            rows.append(row)
            print(f"{case.name}: {json.dumps(_brief(row))}", flush=True)
            meta["wall_seconds"] = round(time.perf_counter() - started, 1)
            write(meta, rows)  # after every case: a run cut short keeps what it measured
    return meta, rows


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated runs of a case: the median of each figure and of each phase (the
    first run's text fields)."""
    row = dict(runs[0])
    if len(runs) == 1:
        return row
    for key, value in runs[0].items():
        if isinstance(value, float):
            row[key] = statistics.median(r[key] for r in runs if isinstance(r.get(key), float))
        elif key.endswith("_phases"):
            names = {name for r in runs for name in r.get(key, {})}
            row[key] = {
                name: statistics.median(r[key][name] for r in runs if name in r.get(key, {}))
                for name in names
            }
    row["repeats"] = len(runs)
    return row


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("plain_s", "blocking_s", "record_s", "shrink_s", "record_shrink_s")
    return {key: round(row[key], 2) for key in keys if isinstance(row.get(key), float)}


def medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    done = [row for row in rows if not row.get("skipped")]

    def median(values: list[float | None]) -> float | None:
        present = [v for v in values if isinstance(v, (int, float))]
        return statistics.median(present) if present else None

    figures = {
        key: median([row.get(key) for row in done])
        for key in ("plain_s", "blocking_s", "record_s", "shrink_s", "record_shrink_s",
                    "shrink_statements")
    }  # fmt: skip
    figures["record_ratio"] = median(
        [row["record_s"] / row["plain_s"] for row in done if row.get("record_s")]
    )
    figures["crash_to_repro_over_plain_s"] = median(
        [row["record_shrink_s"] - row["plain_s"] for row in done if row.get("record_shrink_s")]
    )
    figures["record_then_shrink_over_plain_s"] = median(
        [
            row["record_then_shrink_s"] - row["plain_s"]
            for row in done
            if "record_then_shrink_s" in row
        ]
    )
    for label in ("shrink", "record_shrink"):
        for phase in PHASES:
            figures[f"{label}.{phase}"] = median(
                [row.get(f"{label}_phases", {}).get(phase) for row in done]
            )
    return {key: value for key, value in figures.items() if value is not None}


def _s(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "·"


def _phases(phases: dict[str, float]) -> str:
    return " / ".join(_s(phases.get(name)) for name in PHASES)


def sizes(rows: list[dict[str, Any]]) -> list[Sized]:
    """Each shrink's repro size (statements) beside its seconds (this file's JSON rows)."""
    return [
        Sized(f"{row['case']} / {label.replace('_', ' ')}", row.get(f"{label}_statements"),
              row.get(f"{label}_s"))
        for row in rows if not row.get("skipped")
        for label in ("shrink", "record_shrink")
    ]  # fmt: skip


def render(meta: dict[str, Any], rows: list[dict[str, Any]], figures: dict[str, float]) -> str:
    lines = [
        f"# reprocut pipeline: crash to verified repro ({meta['device_name']}, {meta['device']})",
        "",
        f"Date {meta['date']}, torch {meta['torch']}, Python {meta['python']}, {meta['machine']}, "
        f"load average {meta.get('load_at_start', '?')} at the start, "
        f"commit {meta.get('commit', '?')}. Command: `{meta['command']}` "
        f"({meta['wall_seconds']} s). Wall seconds, one case at a time; with --repeats, the "
        "median of each figure.",
        "",
        "- plain: `python train.py --device D` (the crash); blocking: the same with "
        "`CUDA_LAUNCH_BLOCKING=1` (what a user does today: it names a line, no repro);",
        "- record / shrink: `reprocut record`, then `reprocut shrink` of that recording "
        "(record then shrink = their sum);",
        "- record --shrink: crash to verified repro.py in one command, reusing record's warm "
        "fork server;",
        f"- phases (s): {' / '.join(PHASES)}; they overlap (the fork server starts while the "
        "recording is read), so they can add up to more than the wall time;",
        "- statements: the repro's (size beside time: a faster shrink that writes a larger "
        "repro is a regression).",
        "",
        "| case | op | plain | blocking | record | record x plain | shrink | statements "
        "| shrink checks | shrink phases | record then shrink | record --shrink | statements "
        "| its phases | verified |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.get("skipped"):
            lines.append(f"| {row['case']} | skipped: {row['skipped']} |" + " |" * 13)
            continue
        ratio = row["record_s"] / row["plain_s"] if row.get("plain_s") else None
        verified = (
            f"{row.get('shrink_verified') or '·'} / {row.get('record_shrink_verified') or '·'}"
        )
        lines.append(
            f"| {row['case']} | {row['op']} | {_s(row['plain_s'])} | {_s(row['blocking_s'])} "
            f"| {_s(row['record_s'])} | {_s(ratio)}x | {_s(row.get('shrink_s'))} "
            f"| {row.get('shrink_statements') or '·'} "
            f"| {row.get('shrink_checks') or '·'} | {_phases(row.get('shrink_phases') or {})} "
            f"| {_s(row.get('record_then_shrink_s'))} | {_s(row.get('record_shrink_s'))} "
            f"| {row.get('record_shrink_statements') or '·'} "
            f"| {_phases(row.get('record_shrink_phases') or {})} | {verified} |"
        )
    lines += [
        "",
        "## Medians against the goals (issue #13)",
        "",
        "| figure | median | goal |",
        "|---|---|---|",
        f"| plain run s | {_s(figures.get('plain_s'))} | |",
        f"| `CUDA_LAUNCH_BLOCKING=1` rerun s | {_s(figures.get('blocking_s'))} | |",
        f"| `reprocut shrink` s | {_s(figures.get('shrink_s'))} | {GOALS['shrink_s']} |",
        f"| its repro, statements | {_s(figures.get('shrink_statements'))} | |",
        f"| `reprocut record` x plain | {_s(figures.get('record_ratio'))}x "
        f"| {GOALS['record_ratio']} |",
        f"| crash to verified repro (`record --shrink`) - plain, s "
        f"| {_s(figures.get('crash_to_repro_over_plain_s'))} "
        f"| {GOALS['crash_to_repro_over_plain_s']} |",
        f"| the same with `record` then `shrink` - plain, s "
        f"| {_s(figures.get('record_then_shrink_over_plain_s'))} | |",
        "",
        "| phase (median s) | shrink | record --shrink |",
        "|---|---|---|",
    ]
    for phase in PHASES:
        lines.append(
            f"| {phase} | {_s(figures.get(f'shrink.{phase}'))} "
            f"| {_s(figures.get(f'record_shrink.{phase}'))} |"
        )
    failed = [row for row in rows if row.get("shrink_tail") or row.get("record_shrink_tail")]
    for row in failed:
        tail = (row.get("shrink_tail") or row.get("record_shrink_tail") or "").strip()
        lines += ["", f"`{row['case']}`: no shrink result; stderr tail:", "", "```", tail, "```"]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--cases", nargs="*", help=f"case names, or all (default: {' '.join(DEFAULT_CASES)})"
    )
    parser.add_argument("--timeout", type=float, default=180, help="seconds per command")
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (medians)")
    parser.add_argument("--budget", type=float, default=400, help="start no case after this")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--tag", help="suffix for the result files")
    options = parser.parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    stem = f"pipeline-{options.device}" + (f"-{options.tag}" if options.tag else "")
    previous = read_previous(options.out / f"{stem}.json") or {}
    before = sizes(previous.get("cases") or []), str((previous.get("meta") or {}).get("date", ""))

    def write(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
        figures = medians(rows)
        text = render(meta, rows, figures)
        text += "\n".join(trend_lines(before[0], sizes(rows), unit="statements",
                                       since=before[1])) + "\n"  # fmt: skip
        (options.out / f"{stem}.md").write_text(text)
        data = {"meta": meta, "cases": rows, "medians": figures}
        (options.out / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
        return text

    meta, rows = run(options, write)
    print(write(meta, rows) if rows else "no single-op case matched --cases")
    return 0 if rows and all(not row.get("skipped") for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
