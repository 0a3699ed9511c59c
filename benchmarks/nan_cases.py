"""The NaN/inf corpus: scripts whose first non-finite value has a known origin.

`corpus/nan/<case>/` holds scripts recorded with `reprocut record --nan`; corpus cases that fail
*because of* a NaN (`corpus/llm_sampling_nan`, `corpus/tabular_bce_nan`) carry an `[origin]`
table too and are recorded without `--nan` (record traces the origin on its own). The origin's
line is wherever the single `# reprocut: nan origin` comment sits (for a backward origin, the
forward line that built the node).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "corpus"
MARKER = "# reprocut: nan origin"


@dataclass(frozen=True, slots=True)
class NanCase:
    name: str
    folder: Path
    devices: tuple[str, ...]
    args: tuple[str, ...]
    origin: dict[str, Any]  # how, op, kind, step, phase, autograd_node, facts, ended, float64
    with_nan: bool  # recorded with --nan (corpus/nan/), else traced from the failure

    @property
    def script(self) -> Path:
        return self.folder / "train.py"

    def marker(self) -> tuple[str, int]:
        """(file relative to the case folder, line) of the single origin marker."""
        hits = [
            (str(path.relative_to(self.folder)), number)
            for path in sorted(self.folder.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), start=1)
            if MARKER in line
        ]
        if len(hits) != 1:
            raise ValueError(f"{self.folder}: need exactly one '{MARKER}', found {hits}")
        return hits[0]


def load_nan_cases() -> list[NanCase]:
    cases = []
    for with_nan, pattern in ((True, "nan/*/case.toml"), (False, "*/case.toml")):
        for path in sorted(CORPUS.glob(pattern)):
            data = tomllib.loads(path.read_text())
            if "origin" not in data:
                continue
            cases.append(
                NanCase(
                    name=data["name"],
                    folder=path.parent,
                    devices=tuple(data["devices"]),
                    args=tuple(data.get("args", ())),
                    origin=data["origin"],
                    with_nan=with_nan,
                )
            )
    return cases


def record(
    case: NanCase, device: str, root: Path, *, timeout: float = 600
) -> tuple[int, dict[str, Any], str]:
    """`reprocut record [--nan] --json` on the case: (exit code, the JSON, stderr)."""
    command = [sys.executable, "-m", "reprocut", "record", "--json", "--quiet"]
    command += ["--root", str(root), *(["--nan"] if case.with_nan else [])]
    command += [str(case.script), *case.args, "--device", device]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=env, cwd=root
    )
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        result = {}
    return done.returncode, result, done.stderr


def compare(case: NanCase, result: dict[str, Any]) -> list[str]:
    """What the recording got wrong about the origin (empty when it is right)."""
    truth, found = case.origin, result.get("nonfinite") or {}
    problems = []
    for key in ("how", "op", "kind", "step", "phase", "autograd_node", "module"):
        if key in truth and found.get(key) != truth[key]:
            problems.append(f"{key}: {found.get(key)!r} != {truth[key]!r}")
    file, line = case.marker()
    source = found.get("source") or {}
    if (Path(source.get("file", "")).name, source.get("line")) != (Path(file).name, line):
        problems.append(f"source: {source.get('file')}:{source.get('line')} != {file}:{line}")
    facts = " | ".join(found.get("facts", ()))
    problems += [
        f"fact {want!r} not in {facts!r}" for want in truth.get("facts", ()) if want not in facts
    ]
    ended = (found.get("ended") or {}).get("how")
    if truth.get("ended") and ended != truth["ended"]:
        problems.append(f"ended: {ended!r} != {truth['ended']!r}")
    if case.with_nan and truth.get("how") != "entered" and result.get("op") != truth.get("op"):
        problems.append(f"the failure's op {result.get('op')!r} is not the origin")
    return problems
