"""What the source reducer's own thread spends per accepted script, replayed from the H200's logs.

A script reduction's main thread makes every pass's candidates from each new best and judges
each before a run is paid for (the size order, the failing call, the validity rules). On the
H200 no check was in flight for 15-28 % of a reduction while it did that (faults-cuda.md's
script cases at 87f972f), so this work sits on the path the shrink's seconds are made of. The
bests those reductions accepted are kept in `replays/script-reductions-cuda.json.gz`; this
replays them on the CPU, with no GPU: for every best, every pass's candidates are made and
admitted as the reducer would (`SourceReducer.admissible`), and the seconds of each are summed
per case. `--tree PATH` runs the same in another checkout (the code before a change) beside
this one, and the counts must agree: a change that makes candidates faster must make the same
ones. `--extract LOG...` rebuilds the replay file from check logs (`bench_faults.py --logs`).

    python benchmarks/bench_reducer_work.py [--tree PATH] [--out benchmarks/results/reducer-work-cpu.md]
    python benchmarks/bench_reducer_work.py --extract results/logs/faults/*.shrink.checks.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPLAYS = ROOT / "benchmarks" / "replays" / "script-reductions-cuda.json.gz"
if "REPROCUT_BENCH_TREE" not in os.environ:  # a `--tree` run has that checkout first on its path
    sys.path.insert(0, str(ROOT))


def extract(logs: list[Path], commit: str) -> dict[str, Any]:
    """Each script reduction's rules and accepted bests, in order, from its check log."""
    cases = {}
    for log in logs:
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        rules = next((r for r in rows if r.get("kind") == "rules" and r.get("reducer") == "source"), None)  # fmt: skip
        if rules is None:
            continue  # an op-level shrink: no script was reduced
        bests = [r["code"] for r in rows if r.get("kind") == "accepted" and r.get("reducer") == "source"]  # fmt: skip
        cases[log.name.split(".")[0]] = {
            "focus": rules["focus"],
            "memory_fault": rules["memory_fault"],
            "custom_op": rules.get("custom_op"),
            "op_functions": rules.get("op_functions") or [],
            "bests": bests,
        }
    return {"commit": commit, "device": "NVIDIA H200", "cases": cases}


def replay(case: dict[str, Any]) -> dict[str, Any]:
    """Make and admit every pass's candidates from each best: seconds, counts and a digest of
    what was made and admitted (equal digests: the same candidates and the same answers)."""
    from reprocut.model.case import Signature
    from reprocut.source.fixed_point import SourceReducer
    from reprocut.source.passes import PASSES, PassContext, candidates
    from reprocut.source.validity import Rules

    rules = Rules(memory_fault=case["memory_fault"], custom_op=case["custom_op"],
                  op_functions=tuple(case["op_functions"]), focus=case["focus"])  # fmt: skip
    expected = Signature("RuntimeError", None, None, "replayed")  # never compared: nothing runs
    digest = hashlib.sha256()
    made = admitted = 0
    making = admitting = 0.0
    for best in case["bests"]:
        context = PassContext(focus=case["focus"], memory_fault=case["memory_fault"])
        reducer = SourceReducer(best=best, expected=expected, check=lambda _: None, rules=rules,
                                context=context)  # fmt: skip
        for source_pass in PASSES:
            started = time.perf_counter()
            texts = [c for c in candidates(source_pass, best, context) if c is not None]
            between = time.perf_counter()
            for text in texts:
                ok = reducer.admissible(text, source_pass.__name__)
                if ok:
                    reducer.seen.add(text)
                digest.update(f"{source_pass.__name__}\0{ok}\0{text}\0".encode())
                admitted += ok
            making += between - started
            admitting += time.perf_counter() - between
            made += len(texts)
    return {
        "bests": len(case["bests"]),
        "candidates": made,
        "admitted": admitted,
        "make_s": round(making, 2),
        "admit_s": round(admitting, 2),
        "digest": digest.hexdigest()[:16],
    }


def replay_all() -> dict[str, dict[str, Any]]:
    data = json.loads(gzip.decompress(REPLAYS.read_bytes()))
    return {name: replay(case) for name, case in sorted(data["cases"].items())}


def replay_in(tree: Path, script: Path = Path(__file__)) -> dict[str, dict[str, Any]]:
    """A replay benchmark's `--json` run (`script`: this one by default) with another
    checkout's reprocut, in a process of its own (the tree first on its path, ahead of any
    PYTHONPATH already set)."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "REPROCUT_BENCH_TREE": "1"}
    done = subprocess.run([sys.executable, str(script.resolve()), "--json"], env=env,
                          capture_output=True, text=True, check=True, timeout=3600)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def commit_of(where: Path) -> str:
    done = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() or "unknown"


def report(here: dict[str, dict[str, Any]], there: dict[str, dict[str, Any]] | None,
           tree: Path | None, command: str) -> str:  # fmt: skip
    data = json.loads(gzip.decompress(REPLAYS.read_bytes()))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# The source reducer's own work per accepted script (cpu)",
        "",
        f"{now}, Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} "
        f"cores, load average {os.getloadavg()[0]:.1f} at the end; commit {commit_of(ROOT)}. "
        f"Command: `{command}`.",
        "",
        f"The bests of the H200's script reductions at {data['commit']} "
        "(`replays/script-reductions-cuda.json.gz`), replayed with no GPU: for each best, every "
        "pass's candidates made (`make s`) and judged as the reducer does before a run "
        "(`admit s`: the size order, the failing call, the validity rules). `per best` is both, "
        "over the bests: what the reducer's thread spends on each accepted script. No "
        "candidate runs, so the shrink's repro sizes do not change with these figures; "
        "`digest` covers every candidate made and its answer.",
        "",
    ]
    header = "| case | bests | candidates | admitted | make s | admit s | per best s |"
    if there is not None:
        header += " before: make s | admit s | per best s | same candidates |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    total = {"here": 0.0, "there": 0.0}
    for name, row in here.items():
        per = (row["make_s"] + row["admit_s"]) / max(row["bests"], 1)
        total["here"] += row["make_s"] + row["admit_s"]
        cells = [name, row["bests"], row["candidates"], row["admitted"], row["make_s"],
                 row["admit_s"], f"{per:.2f}"]  # fmt: skip
        if there is not None:
            old = there.get(name)
            if old is None:
                cells += ["", "", "", "not in the other tree"]
            else:
                total["there"] += old["make_s"] + old["admit_s"]
                old_per = (old["make_s"] + old["admit_s"]) / max(old["bests"], 1)
                same = "yes" if old["digest"] == row["digest"] else "**no**"
                cells += [old["make_s"], old["admit_s"], f"{old_per:.2f}", same]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", f"All cases: {total['here']:.1f} s here."]
    if there is not None:
        lines[-1] += (
            f" {total['there']:.1f} s with `{tree}` (commit {commit_of(tree) if tree else ''})."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/reducer-work-cpu.md")
    parser.add_argument("--json", action="store_true", help="print this tree's replay as JSON")
    parser.add_argument("--extract", type=Path, nargs="+", default=None,
                        help="check logs to rebuild the replay file from")  # fmt: skip
    parser.add_argument("--commit", default="unknown", help="the commit the logs came from")
    args = parser.parse_args(argv)
    if args.extract:
        REPLAYS.parent.mkdir(parents=True, exist_ok=True)
        data = extract(args.extract, args.commit)
        REPLAYS.write_bytes(gzip.compress(json.dumps(data, indent=0).encode(), mtime=0))
        print(f"{len(data['cases'])} script reductions -> {REPLAYS}")
        return 0
    if args.json:
        print(json.dumps(replay_all()))
        return 0
    there = replay_in(args.tree.resolve()) if args.tree else None
    here = replay_all()
    command = "python benchmarks/bench_reducer_work.py" + (
        f" --tree {args.tree}" if args.tree else ""
    )
    text = report(here, there, args.tree, command)
    args.out.write_text(text)
    print(text)
    differ = there is not None and any(
        there.get(n, {}).get("digest") != r["digest"] for n, r in here.items()
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
