"""The corpus on disk: one folder per case with `case.toml` (ground truth) and its scripts.

The culprit line is not written in case.toml: it is wherever the single `# reprocut: culprit`
comment sits, so editing a script cannot silently desynchronise the truth (in a notebook: the
line within its code cell). A case is launched as `launch` says: a script (`train.py`), a
notebook (`train.ipynb`) or a pytest suite (`tests/`, run as `-- pytest`); a test has no
training step, so a pytest case names its failing test (`test`, `test_line`) instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the `test` extra installs it
    import tomli as tomllib

import json

from benchmarks.corpus_audit import AuditFormatError, AuditRule, load_rules

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "corpus"
MARKER = "# reprocut: culprit"
DEVICES = ("cpu", "cuda")
EXPECTS = ("fail", "pass", "flaky", "silent-cuda")
LAUNCHES = ("script", "notebook", "pytest")


class CaseFormatError(ValueError):
    """A case.toml that is missing something the harness needs."""


@dataclass(frozen=True, slots=True)
class DeviceTruth:
    """What a device shows: the signature fields and, where it differs, the op."""

    op: str | None = None
    error_type: str | None = None
    error_code: int | None = None
    kind: str | None = None
    surfaced_error: str | None = None
    verified: bool = True  # False: written without running on that device


@dataclass(frozen=True, slots=True)
class CorpusCase:
    name: str
    folder: Path
    domain: str
    family: str
    devices: tuple[str, ...]
    args: tuple[str, ...]
    expect: str
    op: str | None = None
    public_call: str | None = None
    kernel: str | None = None  # custom kernels: no aten op, scored by kernel name
    file: str | None = None
    step: int | None = None
    phase: str | None = None
    module: str | None = None
    facts: tuple[str, ...] = ()
    per_device: dict[str, DeviceTruth] = field(default_factory=dict)
    record_args: tuple[str, ...] = ()
    # a memory fault's expected memcheck fingerprint (reprocut.model.fingerprint): kernel,
    # access, size (misaligned accesses), relation, target (informational)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    launch: str = "script"  # "script", "notebook" or "pytest"
    cell: int | None = None  # notebook: the culprit's cell (index in the cells list)
    test: str | None = None  # pytest: the failing test's node id
    test_line: int | None = None  # pytest: the test's own line the error passed through
    audit: tuple[AuditRule, ...] = ()  # facts the outputs must and must not state (corpus_audit)

    @property
    def script(self) -> Path:
        """What `record` runs: train.py, train.ipynb, or a suite's tests folder."""
        if self.launch == "notebook":
            return self.folder / "train.ipynb"
        if self.launch == "pytest":
            return self.folder / "tests"
        return self.folder / "train.py"

    def applies_to(self, device: str) -> bool:
        return device in self.devices

    def truth(self, device: str) -> DeviceTruth:
        return self.per_device.get(device, DeviceTruth())

    def expected_op(self, device: str) -> str | None:
        return self.truth(device).op or self.op

    def expects_failure(self, device: str) -> bool:
        """Whether a run on `device` must fail (flaky cases may or may not)."""
        if self.expect == "fail":
            return True
        if self.expect == "silent-cuda":
            return device != "cuda" and self.truth(device).error_type is not None
        return False

    def culprit(self) -> tuple[str, int] | None:
        """(file relative to the case folder, line) of the single culprit marker."""
        found = culprit_markers(self.folder)
        return found[0] if len(found) == 1 else None


def culprit_markers(folder: Path) -> list[tuple[str, int]]:
    """(file, line) of every marker; in a notebook the line within its code cell."""
    hits = []
    for path in sorted(folder.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if MARKER in line:
                hits.append((str(path.relative_to(folder)), number))
    for path in sorted(folder.rglob("*.ipynb")):
        for _, number in notebook_markers(path):
            hits.append((str(path.relative_to(folder)), number))
    return hits


def notebook_markers(path: Path) -> list[tuple[int, int]]:
    """(cell index, line within the cell) of each marker in a notebook's code cells."""
    hits = []
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        if cell.get("cell_type") != "code":
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if MARKER in line:
                hits.append((index, number))
    return hits


def _device_truth(data: dict[str, Any]) -> DeviceTruth:
    return DeviceTruth(
        op=data.get("op"),
        error_type=data.get("error_type"),
        error_code=data.get("error_code"),
        kind=data.get("kind"),
        surfaced_error=data.get("surfaced_error"),
        verified=bool(data.get("verified", True)),
    )


def _check_fingerprint(path: Path, fingerprint: dict[str, Any] | None) -> None:
    from reprocut.model.fingerprint import RELATIONS

    if fingerprint is None:
        return
    access = fingerprint.get("access")
    kinds = access if isinstance(access, list) else [access]
    if not fingerprint.get("kernel") or not kinds or not set(kinds) <= {"read", "write", "atomic"}:
        raise CaseFormatError(
            f"{path}: [expected.fingerprint] needs a kernel and an access (or a list of them)"
        )
    if fingerprint.get("relation") not in RELATIONS:
        raise CaseFormatError(f"{path}: fingerprint relation must be one of {RELATIONS}")


def load_case(folder: Path) -> CorpusCase:
    path = folder / "case.toml"
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CaseFormatError(f"{path}: {exc}") from exc
    for key in ("name", "domain", "family", "devices", "expect"):
        if key not in data:
            raise CaseFormatError(f"{path}: missing '{key}'")
    if data["name"] != folder.name:
        raise CaseFormatError(f"{path}: name {data['name']!r} is not the folder name")
    if data.get("launch", "script") not in LAUNCHES:
        raise CaseFormatError(f"{path}: launch must be one of {LAUNCHES}")
    if data["expect"] not in EXPECTS:
        raise CaseFormatError(f"{path}: expect must be one of {EXPECTS}")
    unknown = set(data["devices"]) - set(DEVICES)
    if unknown:
        raise CaseFormatError(f"{path}: unknown devices {sorted(unknown)}")
    expected = data.get("expected", {})
    per_device = {d: _device_truth(expected[d]) for d in DEVICES if d in expected}
    _check_fingerprint(path, expected.get("fingerprint"))
    try:
        audit = load_rules(data.get("audit", {}))
    except AuditFormatError as exc:
        raise CaseFormatError(f"{path}: {exc}") from exc
    return CorpusCase(
        name=data["name"],
        folder=folder,
        domain=data["domain"],
        family=data["family"],
        devices=tuple(data["devices"]),
        args=tuple(data.get("args", ())),
        expect=data["expect"],
        op=expected.get("op"),
        public_call=expected.get("public_call"),
        kernel=expected.get("kernel"),
        file=expected.get("file"),
        step=expected.get("step"),
        phase=expected.get("phase"),
        module=expected.get("module"),
        facts=tuple(data.get("capture", {}).get("facts", ())),
        per_device=per_device,
        record_args=tuple(data.get("record_args", ())),
        fingerprint=dict(expected.get("fingerprint", {})),
        launch=data.get("launch", "script"),
        cell=expected.get("cell"),
        test=expected.get("test"),
        test_line=expected.get("test_line"),
        audit=audit,
    )


def load_cases(root: Path = CORPUS, names: list[str] | None = None) -> list[CorpusCase]:
    """Every case under `root`, sorted by name; `names` keeps those containing any of them."""
    folders = sorted(p.parent for p in root.glob("*/case.toml"))
    cases = [load_case(folder) for folder in folders]
    if names:
        cases = [c for c in cases if any(n in c.name for n in names)]
    return cases
