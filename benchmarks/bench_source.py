"""Benchmark source-level reduction: reprocut's libcst reducer vs a generic reducer (shrinkray).

Both get the same failing scripts, the same time limit and the same notion of "the same bug"
(reprocut's signature of a fresh run); each result is then run again in a fresh `python`, in a
clean copy of the case folder, to verify it. Reported: checks, seconds, final size, verified.

    python benchmarks/bench_source.py                       # CPU cases, 180 s each
    python benchmarks/bench_source.py --device cuda         # + corpus Triton / CuPy cases (GPU)
    python benchmarks/bench_source.py --no-generic          # reprocut only

shrinkray is installed for the benchmark only (`pip install shrinkray`; `SHRINKRAY=/path/to/it`
runs one installed for another Python); without it, its rows say so. Corpus cases that are
missing are skipped with a note. Every child runs with a timeout. Writes
benchmarks/results/source-<device>.md (or --out) with the machine, date and command; a rerun
overwrites it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import generic_reducer, source_cli  # noqa: E402
from benchmarks.size_trend import Sized, read_previous, trend_lines  # noqa: E402
from reprocut.model.case import Signature, TensorSpec  # noqa: E402
from reprocut.model.signature import classify  # noqa: E402
from reprocut.source.launch_specs import with_value_ranges  # noqa: E402
from reprocut.source.passes import parse, sibling_imports  # noqa: E402
from reprocut.source.probe import probe_launch  # noqa: E402
from reprocut.source.reducer import reduce_source  # noqa: E402
from reprocut.source.size import count_lines  # noqa: E402

CASES = ROOT / "benchmarks" / "source_cases"
CORPUS = ROOT / "corpus"
GPU_CASES = ("cuda_triton_expand_bias", "cuda_cupy_misaligned_vec4", "cuda_cupy_contiguous_pe")
MARKER = "# reprocut: culprit"


@dataclass(frozen=True)
class SourceCase:
    name: str
    folder: Path
    expected: Signature
    script: str = "train.py"
    argv: tuple[str, ...] = ()
    focus: str | None = None
    specs: tuple[TensorSpec | None, ...] = ()
    named_specs: tuple[tuple[str, TensorSpec], ...] = ()
    named_values: tuple[tuple[str, Any], ...] = ()
    notes: tuple[str, ...] = field(default=())
    message: str = ""  # the original's message: a reduction keeps how its numbers relate


def locate(folder: Path, focus: str) -> tuple[Path, int] | None:
    """The file and line of the failing call, found by its text (culprit marker stripped)."""
    for path in sorted(folder.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.split(MARKER)[0].strip() == focus.strip():
                return path, number
    return None


def with_probed_specs(case: SourceCase, timeout: float) -> SourceCase:
    """The tensors reaching the failing call, read by `probe_launch` (what a recording of a
    custom-kernel failure knows after its rerun to the launch line), integer tensors generated
    across the range they had, as `reduce_recorded` hands them over (`with_value_ranges`)."""
    found = locate(case.folder, case.focus) if case.focus else None
    if found is None:
        return case
    launch = probe_launch(
        case.folder / case.script,
        cwd=case.folder,
        argv=case.argv,
        file=found[0],
        line=found[1],
        focus=case.focus or "",
        timeout=timeout,
    )
    launch = with_value_ranges(launch, case.focus or "")
    return replace(case, specs=launch.args, named_specs=launch.params, named_values=launch.values)


def cpu_cases() -> list[SourceCase]:
    return [
        SourceCase(
            "helper_error",
            CASES / "helper_error",
            Signature("ValueError", None, None, "sequence of <n> tokens does not fit width <n>"),
            argv=("--epochs", "2"),
            focus="tokens = pad_batch(rows, width=12)",
        ),
        SourceCase(
            "numpy_kernel",
            CASES / "numpy_kernel",
            Signature(
                "RuntimeError",
                None,
                None,
                "fused_bias_gelu: illegal memory access (read <n> elements from a buffer of <n>)",
            ),
            focus="out = fused_bias_gelu(hidden, self.bias.expand_as(hidden))",
        ),
        SourceCase(
            "packed_frames",
            CASES / "packed_frames",
            Signature("RuntimeError", None, None, "cmvn_vec4: misaligned address"),
            focus="return cmvn_vec4(x, mean, 1 / std)",
        ),
        SourceCase(
            "segment_pool",
            CASES / "segment_pool",
            Signature(
                "IndexError", None, None, "index <n> is out of bounds for axis <n> with size <n>"
            ),
            # the numpy kernel's frame takes arrays: the wrapper calling Function.apply is the
            # call a reduction cuts to (what `reprocut shrink --source` finds by itself)
            focus="return SegmentMean.apply(values, segments, count)",
            message="index 6 is out of bounds for axis 0 with size 6",
        ),
    ]


def corpus_case(name: str) -> SourceCase | str:
    """A corpus CUDA case, or why it cannot be benchmarked."""
    folder = CORPUS / name
    if not (folder / "case.toml").exists():
        return f"{name}: not in corpus/ (skipped)"
    import tomllib

    data = tomllib.loads((folder / "case.toml").read_text())
    truth = data.get("expected", {}).get("cuda", {})
    if truth.get("error_code") is None:
        return f"{name}: case.toml has no [expected.cuda] error_code (skipped)"
    focus = None
    for path in sorted(folder.rglob("*.py")):
        for line in path.read_text().splitlines():
            if MARKER in line:
                focus = line.split(MARKER)[0].strip()
    expected = Signature(
        truth.get("error_type", "RuntimeError"), truth["error_code"], None, truth["kind"]
    )
    notes = () if truth.get("verified", True) else ("truth written blind (verified = false)",)
    return SourceCase(
        name, folder, expected, argv=tuple(data.get("args", ())), focus=focus, notes=notes
    )


# --- running one candidate in a fresh process (the generic reducer's check, and verification) --

RUNNER = r"""
import json, os, sys, traceback
result_path, filename = sys.argv[1:3]
sys.argv = [filename, *sys.argv[3:]]
sys.path[0] = os.path.dirname(os.path.abspath(filename))
status = {"status": "passed"}
try:
    with open(filename) as handle:
        code = compile(handle.read(), filename, "exec")
    exec(code, {"__name__": "__main__", "__file__": filename})
except SystemExit as exc:
    status = {"status": "exit", "code": str(exc.code)}
except BaseException as exc:
    traceback.print_exc()
    error_code = getattr(exc, "error_code", None)
    status = {"status": "failed", "type": type(exc).__name__, "message": str(exc),
              "code": error_code if isinstance(error_code, int) else None}
with open(result_path, "w") as handle:
    json.dump(status, handle)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


def fresh_signature(
    script: Path, argv: tuple[str, ...], timeout: float, *, blocking: bool = True
) -> Signature | None:
    """Run `python script argv...` from its folder (with CUDA_LAUNCH_BLOCKING=1 unless not
    `blocking`: a plain run); the signature of its failure, or None."""
    with tempfile.TemporaryDirectory(prefix="bench-source-") as tmp:
        result = Path(tmp) / "result.json"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("CUDA_LAUNCH_BLOCKING", None)
        if blocking:
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        process = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(result), str(script), *argv],
            cwd=script.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.communicate()
            return None
        try:
            status = json.loads(result.read_text())
        except (OSError, ValueError):
            return None
    if status["status"] != "failed":
        return None
    return classify(status["type"], status["message"], stderr, error_code=status["code"])


INTERESTING = r"""#!{python}
# shrinkray's test: the candidate arrives on stdin; exit 0 when it fails with the signature.
import json, shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, {root!r})
from benchmarks.bench_source import fresh_signature
from reprocut.model.case import Signature
with open({counter!r}, "a") as handle:
    handle.write("1\n")
code = sys.stdin.read()
with tempfile.TemporaryDirectory(prefix="bench-generic-") as tmp:
    work = Path(tmp) / "case"
    shutil.copytree({folder!r}, work)
    (work / {script!r}).write_text(code)
    seen = fresh_signature(work / {script!r}, tuple({argv!r}), {timeout!r})
expected = Signature(**json.loads({expected!r}))
sys.exit(0 if seen is not None and seen.matches(expected) else 1)
"""


@dataclass(frozen=True)
class Outcome:
    reducer: str
    seconds: float
    checks: int
    lines: int
    standalone: bool
    verified: bool
    status: str
    code: str = ""
    accepted: str = ""  # reprocut: candidates accepted per pass


def standalone(code: str, folder: Path) -> bool:
    module = parse(code)
    return module is not None and not sibling_imports(module, (folder,))


def verify(case: SourceCase, code: str, timeout: float) -> bool:
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        work = Path(tmp) / "case"
        shutil.copytree(
            case.folder, work, ignore=shutil.ignore_patterns("__pycache__", ".reprocut")
        )
        (work / case.script).write_text(code)
        seen = fresh_signature(work / case.script, case.argv, timeout)
    return seen is not None and seen.matches(case.expected)


def run_reprocut(case: SourceCase, work: Path, time_limit: float | None, timeout: float) -> Outcome:
    """reprocut's reducer on the case (`time_limit` None: its default, to the fixed point)."""
    started = time.perf_counter()
    try:
        result = reduce_source(
            work / case.script,
            cwd=work,
            argv=list(case.argv),
            expected=case.expected,
            specs=case.specs,
            named_specs=case.named_specs,
            named_values=case.named_values,
            focus=case.focus,
            max_time=time_limit,
            timeout=timeout,
            message=case.message or None,
        )
    except Exception as exc:  # a benchmark row, not a crash of the whole benchmark
        return Outcome("reprocut", time.perf_counter() - started, 0, 0, False, False, repr(exc))
    return Outcome(
        "reprocut",
        result.seconds,
        result.checks,
        result.lines,
        standalone(result.code, case.folder),
        verify(case, result.code, timeout),
        result.stopped,
        result.code,
        ", ".join(f"{name} {count}" for name, count in result.accepted if count),
    )


def run_shrinkray(case: SourceCase, work: Path, time_limit: float, timeout: float) -> Outcome:
    if not generic_reducer.installed():
        return Outcome("shrinkray", 0.0, 0, 0, False, False, "shrinkray not installed")
    counter = work.parent / "checks.txt"
    test = work.parent / "interesting.py"
    expected = json.dumps({name: getattr(case.expected, name) for name in
                           ("error_type", "error_code", "op", "kind")})  # fmt: skip
    test.write_text(
        INTERESTING.format(
            python=sys.executable,
            root=str(ROOT),
            counter=str(counter),
            folder=str(case.folder),
            script=case.script,
            argv=list(case.argv),
            timeout=timeout,
            expected=expected,
        )
    )
    test.chmod(0o755)
    target = work.parent / "reduced.py"
    seconds, status = generic_reducer.run_shrinkray(
        test, work / case.script, target, work, time_limit, timeout
    )
    checks = len(counter.read_text().splitlines()) if counter.exists() else 0
    code = target.read_text() if target.exists() else ""
    if not code:
        return Outcome("shrinkray", seconds, checks, 0, False, False, status + ", no output")
    return Outcome(
        "shrinkray",
        seconds,
        checks,
        count_lines(code),
        standalone(code, case.folder),
        verify(case, code, timeout),
        status,
        code,
    )


def run_cli(case: SourceCase, work: Path, time_limit: float | None, timeout: float) -> Outcome:
    """`reprocut record` then `reprocut shrink --source` on the copy (source_cli.py)."""
    found = source_cli.shrink_source_cli(work, case.script, case.argv, timeout * 10, time_limit)
    if "error" in found:
        return Outcome(source_cli.REDUCER, 0.0, 0, 0, False, False, found["error"])
    status = f"{found['stopped']}, {found['runs']} plain runs, {found['statements']} statements"
    return Outcome(
        source_cli.REDUCER,
        found["seconds"],
        found["checks"],
        found["lines"],
        standalone(found["code"], case.folder),
        found["verified"],
        status,
        found["code"],
        ", ".join(f"{name} {count}" for name, count in found["passes"].items()),
    )


def bench(
    cases: list[SourceCase],
    time_limit: float,
    timeout: float,
    generic: bool,
    probe_timeout: float = 600.0,
    reprocut_limit: float | None = None,
    cli: bool = True,
) -> list[tuple[SourceCase, int, Outcome]]:
    """Each case by reprocut's reducer (`reprocut_limit`, None: to its fixed point), by the
    commands a user runs (`cli`) and by shrinkray (`generic`, `time_limit` seconds)."""
    rows = []
    runners = [(run_reprocut, reprocut_limit)]
    runners += [(run_cli, reprocut_limit)] if cli else []
    runners += [(run_shrinkray, time_limit)] if generic else []
    for case in cases:
        case = with_probed_specs(case, probe_timeout)
        original = count_lines((case.folder / case.script).read_text())
        for runner, limit in runners:
            with tempfile.TemporaryDirectory(prefix=f"bench-{case.name}-") as tmp:
                work = Path(tmp) / "case"
                shutil.copytree(
                    case.folder, work, ignore=shutil.ignore_patterns("__pycache__", ".reprocut")
                )
                outcome = runner(case, work, limit, timeout)
            print(f"{case.name}: {outcome.reducer} {outcome}", file=sys.stderr, flush=True)
            rows.append((case, original, outcome))
    return rows


def sizes(rows: list[dict[str, Any]]) -> list[Sized]:
    """Each row's repro size (lines) beside its seconds (this benchmark's JSON rows)."""
    return [Sized(f"{r['case']} / {r['reducer']}", r.get("lines"), r.get("seconds"))
            for r in rows if r.get("lines")]  # fmt: skip


def rows_json(rows: list[tuple[SourceCase, int, Outcome]]) -> list[dict[str, Any]]:
    return [{"case": case.name, "original_lines": original,
             **{k: v for k, v in asdict(o).items() if k != "code"}}
            for case, original, o in rows]  # fmt: skip


def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip() or "?"


def _reprocut_limit(options: argparse.Namespace) -> str:
    if options.reprocut_max_time is None:
        return "at its defaults (to the fixed point, under the 600 s safety cap)"
    return f"limited to {options.reprocut_max_time:.0f} s"


def report(
    rows: list[tuple[SourceCase, int, Outcome]], skipped: list[str], options: argparse.Namespace
) -> str:
    lines = [
        f"# Source reduction: reprocut vs a generic reducer ({options.device})",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {options.load:.1f} at the start (other work shares the machine), "
        f"commit {_commit()}; "
        f"reprocut {_reprocut_limit(options)}; shrinkray {options.max_time:.0f} s per case; "
        f"{options.timeout:.0f} s per check. "
        f"Command: `{' '.join(['python benchmarks/bench_source.py', *sys.argv[1:]])}`.",
        "",
        "Both reducers accept a candidate only when a run fails with the recorded signature "
        "(reprocut: its oracle's fork server; shrinkray: a fresh `python` per check). "
        "`verified`: the result, run again in a fresh process in a clean copy of the case folder, "
        "fails the same way. `standalone`: no import of the user's own modules left. "
        "Lines are non-blank lines of the main script. reprocut also gets the tensors reaching "
        "the failing call the time it raised (`probe_launch`: one traced run with blocking "
        "launches; not counted in its checks or seconds). `reprocut shrink --source`: the "
        "commands a user runs, on a copy of the case: `reprocut record` (not timed), then the "
        "shrink at its defaults, from its own JSON (its wall seconds with the probe, the "
        "reduction and 3 plain verification runs; `verified`: all of them failed the same way).",
        "",
        "| case | original lines | reducer | checks | seconds | final lines | standalone | verified | stopped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, original, o in rows:
        lines.append(
            f"| {case.name} | {original} | {o.reducer} | {o.checks} | {o.seconds:.1f} | "
            f"{o.lines} | {'yes' if o.standalone else 'no'} | {'yes' if o.verified else 'no'} | "
            f"{o.status} |"
        )
    lines += ["", f"Generic reducer: shrinkray {generic_reducer.version()} (the newest that installs "
              "for this Python), one check at a time, its candidate run by the same fresh-process check "
              "used for verification."]  # fmt: skip
    if skipped:
        lines += ["", "Skipped:", *(f"- {reason}" for reason in skipped)]
    notes = [f"- {case.name}: {note}" for case, _, o in rows if o.reducer == "reprocut"
             for note in case.notes]  # fmt: skip
    specs = [f"- {case.name}: {len([s for s in case.specs if s])} argument and "
             f"{len(case.named_specs)} parameter tensor specs probed"
             for case, _, o in rows if o.reducer == "reprocut"]  # fmt: skip
    lines += ["", "Probed specs:", *specs]
    if notes:
        lines += ["", "Notes:", *notes]
    lines += ["", "## Results", ""]
    for case, _, o in rows:
        if o.code:
            lines += [f"### {case.name}: {o.reducer}", ""]
            if o.accepted:
                lines += [f"Accepted per pass: {o.accepted}.", ""]
            lines += ["```python", o.code.rstrip(), "```", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--max-time", type=float, default=180.0,
                        help="seconds per case for the generic reducer")  # fmt: skip
    parser.add_argument("--reprocut-max-time", type=float, default=None,
                        help="a limit for reprocut (default: none, to its fixed point)")  # fmt: skip
    parser.add_argument("--no-cli", action="store_true",
                        help="leave out `reprocut record` + `reprocut shrink --source`")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per check")
    parser.add_argument("--no-generic", action="store_true", help="reprocut only")
    parser.add_argument("--cases", nargs="*", default=None, help="names to run (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()
    options.load = os.getloadavg()[0]

    cases, skipped = cpu_cases(), []
    if options.device == "cuda":
        for name in GPU_CASES:
            found = corpus_case(name)
            if isinstance(found, str):
                skipped.append(found)
            else:
                cases.append(found)
    if options.cases:
        cases = [c for c in cases if c.name in options.cases]
    rows = bench(cases, options.max_time, options.timeout, not options.no_generic,
                 reprocut_limit=options.reprocut_max_time, cli=not options.no_cli)  # fmt: skip
    text = report(rows, skipped, options)
    out = options.out or ROOT / "benchmarks" / "results" / f"source-{options.device}.md"
    previous = sizes(read_previous(out.with_suffix(".json")) or [])
    text += "\n".join(trend_lines(previous, sizes(rows_json(rows)), unit="lines")) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows_json(rows), indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
