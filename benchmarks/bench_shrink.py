"""Benchmark `reprocut shrink`: oracle check cost (fork server vs fresh python), shrink time,
checks, final statements and tensor elements per single-op family; on CPU, optionally, a generic
reducer (shrinkray, installed for the benchmark only) on the same failing scripts.

    python benchmarks/bench_shrink.py                  # CPU, writes benchmarks/results/shrink-cpu.md
    python benchmarks/bench_shrink.py --device cuda    # on a GPU machine
    python benchmarks/bench_shrink.py --generic 120    # + shrinkray vs reprocut, 120 s each per script

Every child runs with a timeout. Figures are wall-clock seconds on the machine it ran on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import generic_reducer  # noqa: E402
from benchmarks.size_trend import Sized, read_previous, trend_lines  # noqa: E402
from reprocut.check.oracle import Oracle, OtherFailure, Reproduced  # noqa: E402
from reprocut.model.case import Captured, Generated, ReproCase, TensorSpec  # noqa: E402
from reprocut.model.limits import SAFETY_CAP  # noqa: E402
from reprocut.shrink.emitter import emit, inline_captured  # noqa: E402
from reprocut.shrink.passes import PASSES  # noqa: E402
from reprocut.shrink.shrinker import Shrinker  # noqa: E402

# scripts for the generic-reducer comparison: single-file corpus cases failing on CPU
GENERIC_SCRIPTS = ("rl_dqn_gather", "vision_label_shift", "tabular_bce_nan")


def families(device: str) -> list[tuple[str, ReproCase, dict[str, torch.Tensor]]]:
    """The device-side-assert families as recordings would capture them (seeded)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (8, 32), generator=gen)
    ids[3, 7] = 1000
    target = torch.randint(0, 5, (64,), generator=gen)
    target[17] = 7
    index = torch.randint(0, 3, (16, 3), generator=gen)
    index[9, 1] = 5
    labels = torch.randint(0, 10, (128,), generator=gen)
    labels[100] = 255
    probs = torch.softmax(torch.randn(4, 100, generator=gen), dim=-1)
    probs[2, 40] = float("nan")
    bce = torch.rand(32, generator=gen)
    bce[20] = 1.5

    def captured(shape: tuple[int, ...], key: str, dtype: str = "int64") -> TensorSpec:
        return TensorSpec(shape, dtype=dtype, device=device, values=Captured(key))

    def noise(*shape: int) -> TensorSpec:
        return TensorSpec(shape, device=device, values=Generated("randn"))

    F = "torch.nn.functional"
    return [
        ("embedding id", ReproCase(f"{F}.embedding", (captured((8, 32), "ids"), noise(50, 16))), {"ids": ids}),
        ("CE target", ReproCase(f"{F}.cross_entropy", (noise(64, 5), captured((64,), "target"))), {"target": target}),
        ("gather index", ReproCase("torch.gather", (noise(16, 3), 1, captured((16, 3), "index"))), {"index": index}),
        ("scatter_add index", ReproCase("torch.Tensor.scatter_add_", (noise(16, 3), 1, captured((16, 3), "index"), noise(16, 3))), {"index": index}),
        ("one_hot", ReproCase(f"{F}.one_hot", (captured((128,), "labels"), 10)), {"labels": labels}),
        ("multinomial NaN", ReproCase("torch.multinomial", (captured((4, 100), "probs", "float32"), 1)), {"probs": probs}),
        ("BCE range", ReproCase(f"{F}.binary_cross_entropy", (captured((32,), "bce", "float32"), TensorSpec((32,), device=device, values=Generated("rand")))), {"bce": bce}),
    ]  # fmt: skip


def timed(f: Callable[[], object]) -> float:
    started = time.perf_counter()
    f()
    return time.perf_counter() - started


def bench_oracle(device: str, repeats: int, timeout: float) -> list[str]:
    _, case, inputs = families(device)[0]
    rows = [
        "| mode | first check (s, incl. startup) | median check (s) | checks |",
        "|---|---|---|---|",
    ]
    for fork in (True, False):
        with Oracle(fork=fork, timeout=timeout) as oracle:
            first = timed(lambda o=oracle: o.check_case(case, inputs))
            times = [timed(lambda o=oracle: o.check_case(case, inputs)) for _ in range(repeats)]
        mode = "fork server" if fork else "fresh python (--no-fork)"
        rows.append(f"| {mode} | {first:.3f} | {statistics.median(times):.3f} | {repeats + 1} |")
    return rows


def bench_families(
    device: str, max_time: float | None, timeout: float, sized: list[Sized]
) -> list[str]:
    rows = [
        "| family | signature | shrink (s) | checks | statements | tensor elements | start elements |",
        "|---|---|---|---|---|---|---|",
    ]
    with Oracle(timeout=timeout) as oracle:
        oracle.check_case(families(device)[0][1], families(device)[0][2])  # start the server
        for name, case, inputs in families(device):
            seen = oracle.check_case(case, inputs)
            if not isinstance(seen, OtherFailure):
                rows.append(f"| {name} | did not fail: {type(seen).__name__} | | | | | |")
                continue
            expected = seen.signature
            case = replace(case, expected=expected)

            def predicate(candidate: ReproCase, e=expected, i=inputs) -> bool:
                return isinstance(oracle.check_case(candidate, i, expected=e), Reproduced)

            started = time.perf_counter()
            shrinker = Shrinker(
                case,
                predicate,
                passes=PASSES,
                inputs=inputs,
                max_time=max_time,
                cpu_visible=expected.error_code is None,
            )
            best = shrinker.run()
            seconds = time.perf_counter() - started
            emitted = emit(inline_captured(best, inputs))
            sized.append(Sized(f"family {name}", emitted.statements, seconds))
            rows.append(
                f"| {name} | {expected.describe()} | {seconds:.2f} | {shrinker.checks} | "
                f"{emitted.statements} | {best.total_numel()} | {case.total_numel()} |"
            )
    return rows


# --- generic reducer comparison (CPU) ------------------------------------------------------------


def code_size(text: str) -> tuple[int, int]:
    """(non-blank, non-comment lines, bytes)."""
    lines = [
        line for line in text.splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    return len(lines), len(text.encode())


def run_reprocut(script_dir: Path, time_limit: float) -> tuple[float, str, str]:
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    record = subprocess.run(
        [sys.executable, "-m", "reprocut", "record", "--json", "train.py"],
        cwd=script_dir, capture_output=True, text=True, timeout=time_limit, env=env,
    )  # fmt: skip
    left = max(10.0, time_limit - (time.perf_counter() - started))
    shrink = subprocess.run(
        [sys.executable, "-m", "reprocut", "shrink", "--json", "--max-time", str(left * 0.6)],
        cwd=script_dir, capture_output=True, text=True, timeout=left + 60, env=env,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    try:
        result = json.loads(shrink.stdout)
        repro = Path(result["repro"]).read_text()
        status = f"{result['status']}, {result['verified']['reproduced']}/{result['verified']['runs']} verified"
    except (json.JSONDecodeError, KeyError, OSError):
        return seconds, "", f"failed (record rc={record.returncode}, shrink rc={shrink.returncode})"
    return seconds, repro, status


def expected_line(script_dir: Path) -> str:
    """The last line of the script's own traceback: what the generic reducer must keep."""
    done = subprocess.run(
        [sys.executable, "train.py"], cwd=script_dir, capture_output=True, text=True, timeout=300
    )
    return done.stderr.strip().splitlines()[-1]


def run_shrinkray(script_dir: Path, time_limit: float) -> tuple[float, str, str]:
    if not generic_reducer.installed():
        return 0.0, "", "shrinkray not installed"
    line = expected_line(script_dir)
    test = script_dir / "interesting.sh"
    # the candidate arrives on stdin; it runs in a copy of the script's folder (helper modules)
    test.write_text(
        "#!/bin/sh\n"
        f'd=$(mktemp -d); cp -r "{script_dir}/." "$d/"; cat > "$d/train.py"; cd "$d"\n'
        f"timeout 60 {sys.executable} train.py 2>&1 | grep -qxF {json.dumps(line)}\n"
        'r=$?; cd /; rm -rf "$d"; exit $r\n'
    )
    test.chmod(0o755)
    target = script_dir / "train.reduced.py"
    seconds, status = generic_reducer.run_shrinkray(
        test, script_dir / "train.py", target, script_dir, time_limit, timeout=60
    )
    if target.exists():
        return seconds, target.read_text(), status
    # shrinkray writes its target only on a first improvement: none means the original is its best
    return seconds, (script_dir / "train.py").read_text(), status + ", no reduction found"


def runs_on(source: Path, device: str) -> bool:
    """Does the corpus case list `device` (cpu, cuda) among its devices?"""
    import tomllib

    devices = tomllib.loads((source / "case.toml").read_text()).get("devices", ["cpu", "cuda"])
    return device.split(":")[0] in devices


def bench_corpus(time_limit: float | None, sized: list[Sized], device: str = "cpu") -> list[str]:
    """record -> shrink -> verify on every failing corpus script (CPU); `time_limit` None:
    shrink at its defaults (to the fixed point)."""
    rows = [
        "| case | record status | op | shrink status | statements | tensor elements | checks | shrink s | verified |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for source in sorted((ROOT / "corpus").iterdir()):
        if not (source / "train.py").exists() or source.name.startswith("control_"):
            continue
        if not runs_on(source, device):
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-{source.name}-") as tmp:
            work = Path(tmp) / source.name
            shutil.copytree(source, work, ignore=shutil.ignore_patterns("__pycache__"))
            try:
                record = subprocess.run(
                    [sys.executable, "-m", "reprocut", "record", "--json", "train.py"],
                    cwd=work, capture_output=True, text=True, timeout=600, env=env,
                )  # fmt: skip
                recorded = json.loads(record.stdout) if record.stdout.strip() else {}
                limit = [] if time_limit is None else ["--max-time", str(time_limit)]
                shrink = subprocess.run(
                    [sys.executable, "-m", "reprocut", "shrink", "--json", *limit],
                    cwd=work, capture_output=True, text=True, env=env,
                    timeout=(time_limit or SAFETY_CAP) + 300,
                )  # fmt: skip
                result = json.loads(shrink.stdout) if shrink.stdout.strip() else {}
            except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
                rows.append(f"| {source.name} | {type(exc).__name__} | | | | | | | |")
                continue
        verified = result.get("verified", {})
        sized.append(
            Sized(f"corpus {source.name}", result.get("statements"), result.get("seconds"))
        )
        rows.append(
            f"| {source.name} | {recorded.get('status')} | {recorded.get('op')} | "
            f"{result.get('status', 'failed')} | {result.get('statements', '')} | "
            f"{result.get('tensor_elements', '')} | {result.get('checks', '')} | "
            f"{result.get('seconds', '')} | {verified.get('reproduced', 0)}/{verified.get('runs', 0)} |"
        )
    return rows


def bench_generic(time_limit: float, sized: list[Sized]) -> list[str]:
    rows = [
        f"Time limit per script: {time_limit:.0f} s each (reprocut: record + shrink + verify).",
        "",
        "| script | original lines | reducer | seconds | result lines | result bytes | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in GENERIC_SCRIPTS:
        source = ROOT / "corpus" / name
        original = (source / "train.py").read_text()
        for reducer, runner in (("reprocut", run_reprocut), ("shrinkray", run_shrinkray)):
            with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
                work = Path(tmp) / name
                shutil.copytree(source, work)
                try:
                    seconds, text, status = runner(work, time_limit)
                except subprocess.TimeoutExpired:
                    seconds, text, status = time_limit, "", "timed out"
            lines, size = code_size(text) if text else (0, 0)
            sized.append(Sized(f"{name} / {reducer}", lines or None, seconds))
            rows.append(
                f"| {name} | {code_size(original)[0]} | {reducer} | {seconds:.1f} | {lines} | {size} | {status} |"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--max-time", type=float, default=None,
                        help="shrink time limit per family (default: none, to the fixed point)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=120.0, help="per check")
    parser.add_argument(
        "--generic", type=float, default=0.0, help="seconds per script for the comparison"
    )
    parser.add_argument("--corpus", action="store_true", help="record + shrink every corpus case")
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()
    today = datetime.date.today().isoformat()
    out = options.out or ROOT / "benchmarks" / "results" / f"shrink-{options.device}.md"
    previous = read_previous(out.with_suffix(".json")) or {}
    sized: list[Sized] = []
    lines = [
        f"# reprocut shrink benchmark ({options.device}, {today})",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.platform(terse=True)}, "
        f"{os.cpu_count()} CPUs. Command: `python benchmarks/bench_shrink.py "
        f"{' '.join(sys.argv[1:])}`",
        "",
        "## Oracle: one check of the embedding case",
        "",
        *bench_oracle(options.device, options.repeats, options.timeout),
        "",
        "## Shrink per single-op family (captured recording -> minimal case)",
        "",
        *bench_families(options.device, options.max_time, options.timeout, sized),
        "",
    ]
    if options.corpus:
        lines += [
            "## record -> shrink on the corpus",
            "",
            *bench_corpus(options.max_time, sized, options.device),
            "",
        ]
    if options.generic:
        lines += [
            "## Generic reducer on the same failing scripts",
            "",
            *bench_generic(options.generic, sized),
            "",
        ]
    before = [Sized(**row) for row in previous.get("sizes") or []]
    since = str((previous.get("meta") or {}).get("date", ""))
    lines += [*trend_lines(before, sized, unit="statements or lines", since=since), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": {"date": today, "command": sys.argv[1:]}, "sizes": [asdict(s) for s in sized]},
        indent=1) + "\n")  # fmt: skip
    print(out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
