"""Check the corpus ground truth on a device without reprocut: what really fails, and where.

    python benchmarks/check_truth.py --device cuda        # on the GPU: confirms [expected.cuda]
    python benchmarks/check_truth.py --device cpu --cases gnn

Each case runs `benchmarks/truth_probe.py` in a fresh process (CUDA_LAUNCH_BLOCKING=1 on CUDA,
so the faulting call raises where it is made), with a timeout and its own process group. The
kernel assertion lines on the child's stderr are classified with reprocut.model.signature, then
compared with case.toml: culprit file and line, step, error code / type, kind, op. Writes
benchmarks/results/truth-<device>.md (the date inside); a case whose truth holds can have its
`verified = false` flag flipped. This process never imports torch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.corpus_cases import CORPUS, REPO, CorpusCase, load_cases
from benchmarks.corpus_score import base_op
from benchmarks.run_corpus import RESULTS
from benchmarks.truth_probe import MARKER
from reprocut.model.signature import classify

PROBE = REPO / "benchmarks" / "truth_probe.py"


def probe_case(case: CorpusCase, device: str, timeout: float) -> dict[str, Any]:
    """Run the probe on one case; its result plus the stderr-aware signature."""
    command = [sys.executable, str(PROBE), str(case.script), *case.args, "--device", device]
    extra = {"CUDA_LAUNCH_BLOCKING": "1"} if device == "cuda" else {}
    return run_json_lines(command, case.folder, timeout, extra)


def run_json_lines(
    command: list[str], cwd: Path, timeout: float, extra_env: dict[str, str]
) -> dict[str, Any]:
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **extra_env, "PYTHONPATH": str(REPO)},
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    lines = [x for x in stdout.splitlines() if x.startswith(MARKER)]
    result = json.loads(lines[-1][len(MARKER) :]) if lines else {"status": "no-result"}
    if result.get("status") == "failed":
        signature = classify(
            result["error_type"],
            result.get("full_message", result["message"]),
            stderr,
            op=result.get("op"),
            error_code=result.get("error_code"),
        )
        result["error_code"] = signature.error_code
        result["kind"] = signature.kind
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["stderr_tail"] = stderr[-600:]
    return result


def compare(case: CorpusCase, device: str, got: dict[str, Any]) -> list[str]:
    """Differences between the probe's observation and case.toml (empty: the truth holds)."""
    if case.expect == "flaky":
        return []
    if not case.expects_failure(device):
        return [] if got.get("status") == "passed" else [f"must pass, got {got.get('status')}"]
    if got.get("status") != "failed":
        return [f"did not fail ({got.get('status')})"]
    truth = case.truth(device)
    culprit = case.culprit() or (None, None)
    want = {
        "file": culprit[0],
        "line": culprit[1],
        "steps": case.step,
        "error_type": truth.error_type,
        "error_code": truth.error_code,
        "kind": truth.kind,
    }
    problems = [
        f"{key} {got.get(key)!r} != {value!r}"
        for key, value in want.items()
        if value is not None and got.get(key) != value
    ]
    want_op = base_op(case.expected_op(device))
    if want_op and want_op not in (base_op(got.get("op")), got.get("public_call")):
        problems.append(f"op {got.get('op')!r} / {got.get('public_call')!r} != {want_op!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--cases", nargs="*")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--out", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    cases = [c for c in load_cases(CORPUS, options.cases) if c.applies_to(options.device)]
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        results = list(pool.map(lambda c: probe_case(c, options.device, options.timeout), cases))
    rows = ["| case | holds | observed | differences |", "|---|---|---|---|"]
    held = 0
    for case, got in zip(cases, results, strict=True):
        problems = compare(case, options.device, got)
        held += not problems
        seen = (
            f"{got.get('file')}:{got.get('line')} step {got.get('steps')} "
            f"{got.get('error_type')} {got.get('error_code')} {got.get('kind')!r} "
            f"{got.get('op') or got.get('public_call')}"
            if got.get("status") == "failed"
            else str(got.get("status"))
        )
        rows.append(
            f"| {case.name} | {'✓' if not problems else '✗'} | {seen.replace('|', '/')} "
            f"| {'; '.join(problems).replace('|', '/')} |"
        )
        print(f"{'ok ' if not problems else 'BAD'} {case.name} {problems}", file=sys.stderr)
    date = dt.date.today().isoformat()
    options.out.mkdir(parents=True, exist_ok=True)
    path = options.out / f"truth-{options.device}.md"
    text = [
        f"# corpus ground truth on {options.device} ({date})",
        "",
        "Observed by benchmarks/truth_probe.py (no reprocut), "
        + ("CUDA_LAUNCH_BLOCKING=1." if options.device == "cuda" else "plain run."),
        "",
        f"**{held}/{len(cases)} cases hold.**",
        "",
        *rows,
        "",
    ]
    path.write_text("\n".join(text))
    (path.with_suffix(".json")).write_text(
        json.dumps({c.name: r for c, r in zip(cases, results, strict=True)}, indent=2) + "\n"
    )
    print(f"wrote {path}")
    return 0 if held == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
