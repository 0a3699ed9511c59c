"""Score reprocut (record + shrink) on every corpus case for one device; write the table.

    python benchmarks/run_corpus.py --device cpu                 # CI machine
    python benchmarks/run_corpus.py --device cuda --jobs 1       # on the GPU
    python benchmarks/run_corpus.py --device cpu --cases gnn lm --no-shrink

Each case runs in its own scratch directory (its own `.reprocut/`), as subprocesses with a
timeout and their own process group, so a hung or crashed run is a scored failure, not a hung
harness. This process never imports torch or touches CUDA: the device facts come from a child.
Writes benchmarks/results/corpus-<device>.md and .json (the date inside; a rerun overwrites them;
`--tag T` writes corpus-<device>-T.* instead, for a partial run to `--merge`); `--baseline FILE`
exits 1 if a check that passed in the baseline fails now, `--update-baseline FILE` rewrites it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.corpus_audit import audit
from benchmarks.corpus_cases import CORPUS, REPO, CorpusCase, load_cases
from benchmarks.corpus_report import audit_lines, write_results
from benchmarks.corpus_score import (
    CaseScore,
    RunOutput,
    regressions,
    score_case,
    totals,
    with_audit,
)
from reprocut.check.check_log import LOG_ENV

RESULTS = REPO / "benchmarks" / "results"
ENV_PROBE = (
    "import json, platform, sys, torch\n"
    "name = platform.processor() or platform.machine()\n"
    "if sys.argv[1] == 'cuda':\n"
    "    name = torch.cuda.get_device_name(0)\n"
    "print(json.dumps({'torch': torch.__version__, 'device_name': name,"
    " 'python': platform.python_version(), 'platform': platform.platform()}))\n"
)


# where the commands run here import `reprocut` from: this checkout, or another (`use_tree`)
_code_root = REPO


def use_tree(tree: Path) -> None:
    """Run `reprocut` from `tree`, another checkout's root, and the benchmark from this one: two
    commits measured in one device call, on one machine (the H200's calls vary by 20 s a case)."""
    global _code_root
    if not (tree / "reprocut" / "__init__.py").is_file():
        raise SystemExit(f"--tree {tree}: no reprocut package there")
    _code_root = tree.resolve()


def run_json(command: list[str], cwd: Path, timeout: float, log: Path | None = None) -> RunOutput:
    """Run `command`, kill its whole process group after `timeout`, parse its JSON stdout.
    `log`: its stderr is also written there as it comes, each line stamped with the seconds
    since the start, so a run killed by an outer limit still shows how far it got, and each
    check, pass and phase it ran goes beside it as JSON lines (`.checks.jsonl`, see
    reprocut.check.check_log)."""
    env = dict(os.environ)
    if log is not None:
        env[LOG_ENV] = str(log.with_suffix(".checks.jsonl"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_code_root), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    if log is not None:
        return _run_logged(process, log, timeout, start)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        returncode: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        returncode = None
    seconds = time.perf_counter() - start
    return RunOutput(returncode, parse_json(stdout), seconds, stderr[-2000:])


def _run_logged(
    process: subprocess.Popen[str], log: Path, timeout: float, start: float
) -> RunOutput:
    """`run_json`'s wait with stderr copied line by line, stamped, to `log`."""
    lines: list[str] = []
    stdout: list[str] = []

    def copy_stderr() -> None:
        with log.open("w", buffering=1) as out:
            for line in process.stderr or ():
                lines.append(line)
                out.write(f"[{time.perf_counter() - start:7.1f} s] {line}")

    readers = [
        threading.Thread(target=copy_stderr, daemon=True),
        threading.Thread(target=lambda: stdout.append((process.stdout or io.StringIO()).read()),
                         daemon=True),
    ]  # fmt: skip
    for reader in readers:
        reader.start()
    try:
        returncode: int | None = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        returncode = None
    exited = time.perf_counter() - start
    for reader in readers:
        reader.join(timeout=10)
    seconds = time.perf_counter() - start
    # a child that outlives the command holds its pipes open: the seconds count until they close
    with log.open("a") as out:
        out.write(f"[{seconds:7.1f} s] (harness) the command exited at {exited:.1f} s, its "
                  f"pipes closed at {seconds:.1f} s; started at {time.time() - seconds:.3f} (epoch)\n")  # fmt: skip
    return RunOutput(returncode, parse_json("".join(stdout)), seconds, "".join(lines)[-2000:])


def parse_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object a `--json` command printed (the whole stdout, or its last object)."""
    text = stdout.strip()
    if not text:
        return None
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else None
    except json.JSONDecodeError:
        pass
    start = text.rfind("\n{")
    while start != -1:
        try:
            data = json.loads(text[start + 1 :])
            return data if isinstance(data, dict) else None
        except json.JSONDecodeError:
            start = text.rfind("\n{", 0, start)
    return None


def record_command(case: CorpusCase, device: str, extra: list[str], timeout: float) -> list[str]:
    if case.launch == "pytest":  # the suite from its own folder: node ids as its tests name them
        folder = str(case.folder)
        launch = ["--", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", folder]
        return [
            *record_command_head(timeout),
            *case.record_args,
            *extra,
            *launch,
            str(case.script),
            *case.args,
            "--device",
            device,
        ]
    return [
        *record_command_head(timeout),
        *case.record_args,
        *extra,
        str(case.script),
        *case.args,
        "--device",
        device,
    ]


def record_command_head(timeout: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reprocut",
        "record",
        "--json",
        "--quiet",
        "--timeout",
        str(int(timeout)),
    ]


def shrink_command(run_dir: str, out: Path, timeout: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reprocut",
        "shrink",
        "--json",
        "--out",
        str(out),
        "--max-time",
        str(int(timeout * 0.8)),
        run_dir,
    ]


def run_case(
    case: CorpusCase,
    device: str,
    *,
    timeout: float,
    shrink: bool,
    record_extra: list[str],
    workdir: Path,
) -> CaseScore:
    """Record (and shrink, if it recorded a failure) one case in its own scratch directory."""
    scratch = workdir / case.name
    scratch.mkdir(parents=True, exist_ok=True)
    record = run_json(record_command(case, device, record_extra, timeout), scratch, timeout + 30)
    shrunk = None
    run_dir = (record.data or {}).get("run_dir")
    recorded = record.returncode == 0 or (  # under pytest, record exits with pytest's code
        case.launch == "pytest" and (record.data or {}).get("status") == "localized"
    )
    if shrink and run_dir and recorded:
        run_dir = str((scratch / run_dir).resolve())  # no-op when already absolute
        shrunk = run_json(shrink_command(run_dir, scratch / "repro", timeout), scratch, timeout)
    score = score_case(case, device, record, shrunk)
    if record.data is None:  # nothing printed: no fact to audit
        return score
    return with_audit(score, audit(case.audit, device, case_outputs(record, shrunk, scratch)))


def case_outputs(record: RunOutput, shrunk: RunOutput | None, scratch: Path) -> dict[str, str]:
    """What reprocut printed for a case, as the facts audit reads it: the panel (drawn from
    the recording as a terminal 100 columns wide shows it), `record --json` then `shrink
    --json`, report.md and repro.py."""
    data = [run.data for run in (record, shrunk) if run is not None and run.data is not None]
    outputs = {"json": "\n".join(json.dumps(d, ensure_ascii=False) for d in data)}
    run_dir = (record.data or {}).get("run_dir")
    if run_dir and (scratch / run_dir / "failure.json").is_file():
        from reprocut.model.recording import RunDir  # no torch: this process never imports it
        from reprocut.report.display.failure import panel_text

        run = RunDir((scratch / run_dir).resolve())
        outputs["panel"] = panel_text(run.read_failure(), run.path)
    for name, key in (("report", "report"), ("repro", "repro")):
        path = (shrunk.data or {}).get(key) if shrunk is not None else None
        if path and Path(path).is_file():
            outputs[name] = Path(path).read_text()
    return outputs


def run_cases(
    cases: list[CorpusCase],
    device: str,
    *,
    jobs: int,
    timeout: float,
    shrink: bool | set[str],
    record_extra: list[str] | None = None,
    workdir: Path | None = None,
    on_score: Any = None,
) -> list[CaseScore]:
    """Score `cases` (those that apply to `device`), `jobs` at a time, in case order.

    `shrink` is True (all), False (none) or the set of case names to shrink.
    """
    applicable = [c for c in cases if c.applies_to(device)]
    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="reprocut-corpus-")) if owned else workdir

    def one(case: CorpusCase) -> CaseScore:
        wants_shrink = shrink if isinstance(shrink, bool) else case.name in shrink
        score = run_case(
            case,
            device,
            timeout=timeout,
            shrink=wants_shrink,
            record_extra=record_extra or [],
            workdir=root,
        )
        if on_score is not None:
            on_score(score)
        return score

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, applicable))


def environment(device: str) -> dict[str, Any]:
    probe = subprocess.run(
        [sys.executable, "-c", ENV_PROBE, device], capture_output=True, text=True, timeout=120
    )
    facts = parse_json(probe.stdout) or {"torch": "?", "device_name": "?", "python": "?"}
    facts.setdefault("platform", "?")
    # the device machine's copy of the tree carries stale git metadata: the caller names the commit
    commit = os.environ.get("REPROCUT_COMMIT") or _git("rev-parse", "--short", "HEAD")
    if "REPROCUT_COMMIT" not in os.environ and commit and _git("status", "--porcelain", "reprocut"):
        commit += " + uncommitted changes under reprocut/"
    return {**facts, "commit": commit or "?"}


def _git(*args: str) -> str:
    """git output, or "" where there is no git or no repository (the GPU machine's copy)."""
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def load_baseline(path: Path, device: str) -> dict[str, list[str]]:
    if not path.exists():
        return {}
    return json.loads(path.read_text()).get(device, {})


def save_baseline(path: Path, device: str, scores: list[CaseScore]) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data[device] = {s.case: s.baseline_checks() for s in scores if s.baseline_checks()}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--cases", nargs="*", help="only cases whose name contains one of these")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per command")
    parser.add_argument("--jobs", type=int, default=None, help="cases at once (cpu 2, cuda 1)")
    parser.add_argument("--no-shrink", action="store_true", help="score record only")
    parser.add_argument("--record-arg", action="append", default=[], help="extra record flag")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--baseline", type=Path, help="fail if a check passing here regresses")
    parser.add_argument("--update-baseline", type=Path, help="write passing checks here")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--tag", help="suffix for the result files (a partial run)")
    parser.add_argument(
        "--merge", nargs="+", type=Path, metavar="JSON", help="combine partial results, run nothing"
    )
    return parser.parse_args(argv)


def merge(paths: list[Path], out: Path) -> tuple[Path, Path]:
    """One table from several partial runs (the device allows 10 minutes per command)."""
    parts = [json.loads(p.read_text()) for p in paths]
    by_case = {}
    for part in parts:  # later files win for a case run twice
        for data in part["cases"]:
            by_case[data["case"]] = CaseScore.from_json(data)
    meta = dict(parts[-1]["meta"])
    meta.pop("tag", None)
    meta["command"] = " + ".join(p["meta"]["command"] for p in parts)
    meta["wall_seconds"] = round(sum(p["meta"].get("wall_seconds", 0) for p in parts), 1)
    return write_results([by_case[name] for name in sorted(by_case)], meta, out)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    if options.merge:
        for path in merge(options.merge, options.out):
            print(f"wrote {path}")
        return 0
    cases = load_cases(options.corpus, options.cases)
    jobs = options.jobs or (2 if options.device == "cpu" else 1)
    started = time.perf_counter()
    meta = {
        "device": options.device,
        "date": dt.date.today().isoformat(),
        "command": " ".join(["python benchmarks/run_corpus.py", *(argv or sys.argv[1:])]),
        **environment(options.device),
    }
    if options.tag:
        meta["tag"] = options.tag
    done: list[CaseScore] = []
    lock = threading.Lock()

    def progress(score: CaseScore) -> None:
        """Rewrite the table after every case, so a run killed by a time limit still leaves one."""
        verdict = "pass" if score.passed else "FAIL"
        print(f"{verdict:4} {score.case} ({score.record_seconds}s)", file=sys.stderr, flush=True)
        with lock:
            done.append(score)
            partial = {**meta, "wall_seconds": round(time.perf_counter() - started, 1)}
            partial["incomplete"] = f"{len(done)} of {len(applicable)} cases"
            write_results(sorted(done, key=lambda s: s.case), partial, options.out)

    applicable = [c for c in cases if c.applies_to(options.device)]
    scores = run_cases(
        applicable,
        options.device,
        jobs=jobs,
        timeout=options.timeout,
        shrink=not options.no_shrink,
        record_extra=options.record_arg,
        on_score=progress,
    )
    meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    markdown, twin = write_results(scores, meta, options.out)
    print(f"wrote {markdown.relative_to(REPO) if markdown.is_relative_to(REPO) else markdown}")
    print(f"wrote {twin.name}")
    print(audit_lines(scores, totals(scores))[0])  # facts checked, false facts found
    if options.update_baseline:
        save_baseline(options.update_baseline, options.device, scores)
    if options.baseline:
        lost = regressions(load_baseline(options.baseline, options.device), scores)
        for line in lost:
            print(f"regression: {line}", file=sys.stderr)
        return 1 if lost else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
