"""What the last round of a script reduction checks, read statically from the H200's fixed points.

A reduction ends with a round of every pass that accepts nothing: each candidate it runs is a
check spent to learn that. The repros the H200 reduced (`results/faults-cuda-repros/`, the
cases whose shrink took the script path) are such fixed points, so the candidates this
checkout's passes make from them, less those its reducer would not run (not smaller, the
failing call lost, a validity rule broken: reprocut.source.validity), are what that round
costs, with no GPU here: every one of them was rejected there. `--tree PATH` counts for
another checkout as well (run in a process with that tree first on the path).

    python benchmarks/last_round.py [--tree PATH] [--out benchmarks/results/last-round-cpu.md]
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPROS = ROOT / "benchmarks" / "results" / "faults-cuda-repros"


def script_cases() -> list[str]:
    """The cases whose committed repro came from a script reduction."""
    names = []
    for path in sorted(REPROS.glob("*.shrink.json")):
        if json.loads(path.read_text()).get("path") == "source":
            names.append(path.name.removesuffix(".shrink.json"))
    return names


def reduced_code(name: str) -> str:
    """The repro as its reduction ended: without the header docstring shrink adds after it, and
    without the `torch.cuda.synchronize()` the reducer's finish adds at its end
    (reprocut.source.finish: the fork's child waits for the GPU after every candidate, so no
    fixed point keeps one there; counted, it is a deletion no round offered)."""
    text = (REPROS / f"{name}.py").read_text()
    body = ast.parse(text).body
    first = body[1].lineno if body and isinstance(body[0], ast.Expr) else 1
    lines = text.splitlines()[first - 1 :]
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and lines[-1] == "torch.cuda.synchronize()":
        lines.pop()
    return "\n".join(lines) + "\n"


def count(name: str) -> dict[str, int] | None:
    """Candidates per pass the reducer would run on the case's fixed point (None: no launch to
    take for the failing call), by the reducer's own `admissible`."""
    from reprocut.model.case import Signature
    from reprocut.source.fixed_point import SourceReducer
    from reprocut.source.passes import PASSES, PassContext, candidates
    from reprocut.source.passes.launches import launches
    from reprocut.source.passes.tree import parse
    from reprocut.source.validity import Rules

    code = reduced_code(name)
    module = parse(code)
    found = launches(module) if module is not None else []
    kernel = found[-1].kernel if found else None
    focus = next(
        (line for line in reversed(code.splitlines())
         if kernel and line.startswith((kernel + "(", kernel + "["))),
        None,
    )  # fmt: skip
    if focus is None:
        return None
    shrink = json.loads((REPROS / f"{name}.shrink.json").read_text())
    expected = Signature(**shrink["signature"])
    reducer = SourceReducer(
        best=code, expected=expected, check=lambda _: None, rules=Rules(memory_fault=True, focus=focus),
        context=PassContext(focus=focus, memory_fault=True),
    )  # fmt: skip
    counts: dict[str, int] = {}
    for source_pass in PASSES:
        for candidate in candidates(source_pass, code, reducer.context):
            if reducer.admissible(candidate, source_pass.__name__):
                reducer.seen.add(candidate)
                counts[source_pass.__name__] = counts.get(source_pass.__name__, 0) + 1
    return counts


def counts_in(tree: Path | None) -> dict[str, dict[str, int] | None]:
    if tree is None:
        return {name: count(name) for name in script_cases()}
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--json"],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(done.stdout)


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    return done.stdout.strip() or "?"


def report(here: dict[str, dict[str, int] | None], there: dict[str, dict[str, int] | None] | None,
           tree: Path | None) -> str:  # fmt: skip
    lines = [
        "# The last round of a script reduction, on the H200's fixed points",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {_commit()}, "
        f"Python {sys.version.split()[0]}; no GPU needed. Command: "
        f"`python benchmarks/last_round.py{' --tree TREE' if tree else ''}`.",
        "",
        "The repros in `faults-cuda-repros/` whose shrink reduced the script are fixed points:",
        "their last round accepted nothing. `candidates`: what this checkout's passes make from",
        "each that its reducer would run (smaller, still making the failing call, no validity",
        "rule broken); each is a check spent in that round, on the H200 a second or more.",
        "The `torch.cuda.synchronize()` the reducer's finish adds after its fixed point is no",
        "part of it (counted before 2026-12-05: one deletion more a case).",
        "",
        "| case | candidates | " + ("before | " if there else "") + "by pass |",
        "|---|---|" + ("---|" if there else "") + "---|",
    ]
    for name, counts in here.items():
        if counts is None:
            lines.append(f"| {name} | no launch read | " + ("| " if there else "") + "|")
            continue
        before = (there or {}).get(name)
        then = "" if there is None else f"{sum(before.values()) if before else '-'} | "
        passes = ", ".join(f"{k} {v}" for k, v in counts.items())
        lines.append(f"| {name} | {sum(counts.values())} | {then}{passes} |")
    total = sum(sum(c.values()) for c in here.values() if c)
    lines += ["", f"Total: {total} candidates."]
    if there is not None:
        previous = sum(sum(c.values()) for c in there.values() if c)
        lines[-1] += f" With `--tree` ({tree.name if tree else ''}): {previous}."
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=None, help="another checkout to count too")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/last-round-cpu.md")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps(counts_in(None)))
        return 0
    here = counts_in(None)
    there = counts_in(args.tree.resolve()) if args.tree else None
    args.out.write_text(report(here, there, args.tree))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
