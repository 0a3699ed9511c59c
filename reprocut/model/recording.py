"""A recording on disk: the run directory `record` writes and `shrink` reads.

Layout of `.reprocut/runs/<id>/`:
    meta.json      the command, environment summary and status, written first and updated last
    trace.jsonl    one JSON line per completed step (its ops), appended as the script runs
    failure.json   the localized failure (a Failure), once known
    inputs.pt      captured input tensors by key (torch.save, loads with weights_only=True)
    stdout.txt, stderr.txt   the script's own output, teed
`.reprocut/latest` holds the id of the newest run; `.reprocut/.gitignore` holds `*`.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reprocut.model.after_loop import AfterLoop
from reprocut.model.case import (
    ReproCase,
    Signature,
    SourceLocation,
    TensorSpec,
    signature_from_json,
    signature_to_json,
    spec_from_json,
    spec_to_json,
)
from reprocut.model.compiled import CompileVerdict
from reprocut.model.errors import CorruptRecordingError, NoRecordingError
from reprocut.model.failing_test import FailingTest
from reprocut.model.job import JobRerun, RankSummary
from reprocut.model.memory import MemoryReport
from reprocut.model.nonfinite import NonfiniteOrigin, location_from_json, location_json

DEFAULT_ROOT = Path(".reprocut")
FAILURE_FILE = "failure.json"
META_FILE = "meta.json"
TRACE_FILE = "trace.jsonl"
LAUNCH_PROBE_FILE = "launch_probe.json"  # what reached a custom kernel launch (source.probe)
RECORD_OUTCOME_FILE = "record.outcome.json"  # how the recorded run ended (record/parent/runner)
INPUTS_FILE = "inputs.pt"
OUTCOME_FILE = "outcome.json"  # the child's own report of the run (record/inside/outcome.py)
GITIGNORE = "# Created by reprocut: recordings hold captured tensors; keep them out of git.\n*\n"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """The exception as the user's process saw it, with the kernel assertions from its stderr."""

    type: str
    message: str
    code: int | None = None
    name: str | None = None  # "device-side assert triggered"
    assertions: tuple[dict[str, Any], ...] = ()
    # what the script saw instead, where PyTorch lost the op's error on its way ({type, message})
    surfaced_as: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "type": self.type,
            "message": self.message,
            "code": self.code,
            "name": self.name,
            "assertions": list(self.assertions),
        }
        if self.surfaced_as is not None:
            data["surfaced_as"] = self.surfaced_as
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorInfo:
        return cls(
            type=data["type"],
            message=data["message"],
            code=data.get("code"),
            name=data.get("name"),
            assertions=tuple(data.get("assertions", ())),
            surfaced_as=data.get("surfaced_as"),
        )


@dataclass(frozen=True, slots=True)
class TensorReport:
    """One input of the culprit op, with the facts that explain the failure."""

    name: str
    spec: TensorSpec
    facts: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "spec": spec_to_json(self.spec), "facts": list(self.facts)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorReport:
        return cls(data["name"], spec_from_json(data["spec"]), tuple(data.get("facts", ())))


@dataclass(frozen=True, slots=True)
class Failure:
    """What failed and where: the product of `record`, the input of `shrink`.

    status: "localized" (culprit op found), "outside-dispatcher" (a custom kernel: only the launch
    line is known), "not-localized" (failed once, not again), "script-error" (not a torch op),
    "nonfinite-input" (`--nan`: the NaN/inf was already in the data or state, no op made it).
    """

    status: str
    error: ErrorInfo
    signature: Signature
    op: str | None = None  # "aten::embedding"
    kernel: str | None = None  # outside the dispatcher: the launched kernel's name
    public_call: str | None = None  # "torch.nn.functional.embedding"
    step: int | None = None
    phase: str | None = None  # "forward", "backward", "optimizer", "other"
    module: str | None = None  # "model.encoder.embed"
    source: SourceLocation | None = None  # the user's line that led to the op
    forward_source: SourceLocation | None = None  # for backward ops: the forward line
    surfaced_at: SourceLocation | None = None  # where the exception appeared in the first run
    tensors: tuple[TensorReport, ...] = ()
    diagnosis: str = ""
    localization: str = ""  # "in-process", "snapshot-replay", "rerun"
    device: str = "cpu"
    cases: tuple[ReproCase, ...] = ()  # candidate repros, most public first
    notes: tuple[str, ...] = ()
    script: str = ""
    argv: tuple[str, ...] = ()
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)  # versions only: never the user's env vars
    # the deepest frame outside torch that called the failing torch API (a library's line, such
    # as transformers' `loss = loss_fct(...)`, when `source` is only `trainer.train()`)
    call_site: SourceLocation | None = None
    loop: dict[str, int] = field(default_factory=dict)  # the user's `for` counters at the failure
    frameworks: dict[str, str] = field(default_factory=dict)  # versions the script imported
    run_module: str | None = None  # launched as `python -m run_module`
    nonfinite: NonfiniteOrigin | None = None  # where a NaN/inf came from (`record --nan`)
    rank: int | None = None  # under torchrun: the culprit's global rank
    world_size: int | None = None
    ranks: tuple[RankSummary, ...] = ()  # every rank of the job, what it saw
    job_reruns: tuple[JobRerun, ...] = ()  # reruns of the whole job that localized the culprit
    torch_compile: CompileVerdict | None = None  # the script used torch.compile: the verdict
    test: FailingTest | None = None  # under pytest: the test that failed (it has no step)
    memory: MemoryReport | None = None  # an out-of-memory failure: request, holders, leak
    # a custom op's failure: the deepest line of the user's code below `source` (the op's call),
    # inside the op's implementation (the launch of its kernel, often in a sibling module)
    launch: SourceLocation | None = None
    after_loop: AfterLoop | None = None  # the training loop had ended: no step (step is None)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error.to_json(),
            "signature": signature_to_json(self.signature),
            "op": self.op,
            "kernel": self.kernel,
            "public_call": self.public_call,
            "step": self.step,
            "phase": self.phase,
            "module": self.module,
            "source": location_json(self.source),
            "forward_source": location_json(self.forward_source),
            "surfaced_at": location_json(self.surfaced_at),
            "tensors": [tensor.to_json() for tensor in self.tensors],
            "diagnosis": self.diagnosis,
            "localization": self.localization,
            "device": self.device,
            "cases": [case.to_json() for case in self.cases],
            "notes": list(self.notes),
            "script": self.script,
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "call_site": location_json(self.call_site),
            "loop": dict(self.loop),
            "frameworks": dict(self.frameworks),
            "run_module": self.run_module,
            "nonfinite": None if self.nonfinite is None else self.nonfinite.to_json(),
            "rank": self.rank,
            "world_size": self.world_size,
            "ranks": [summary.to_json() for summary in self.ranks],
            "job_reruns": [rerun.to_json() for rerun in self.job_reruns],
            "torch_compile": None if self.torch_compile is None else self.torch_compile.to_json(),
            "test": None if self.test is None else self.test.to_json(),
            "memory": None if self.memory is None else self.memory.to_json(),
            "launch": location_json(self.launch),
            "after_loop": None if self.after_loop is None else self.after_loop.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Failure:
        signature = signature_from_json(data["signature"])
        assert signature is not None
        return cls(
            status=data["status"],
            error=ErrorInfo.from_json(data["error"]),
            signature=signature,
            op=data.get("op"),
            kernel=data.get("kernel"),
            public_call=data.get("public_call"),
            step=data.get("step"),
            phase=data.get("phase"),
            module=data.get("module"),
            source=location_from_json(data.get("source")),
            forward_source=location_from_json(data.get("forward_source")),
            surfaced_at=location_from_json(data.get("surfaced_at")),
            tensors=tuple(TensorReport.from_json(t) for t in data.get("tensors", ())),
            diagnosis=data.get("diagnosis", ""),
            localization=data.get("localization", ""),
            device=data.get("device", "cpu"),
            cases=tuple(ReproCase.from_json(c) for c in data.get("cases", ())),
            notes=tuple(data.get("notes", ())),
            script=data.get("script", ""),
            argv=tuple(data.get("argv", ())),
            cwd=data.get("cwd", ""),
            env=dict(data.get("env", {})),
            call_site=location_from_json(data.get("call_site")),
            loop={str(k): int(v) for k, v in (data.get("loop") or {}).items()},
            frameworks={str(k): str(v) for k, v in (data.get("frameworks") or {}).items()},
            run_module=data.get("run_module"),
            test=FailingTest.from_json(data.get("test")),
            nonfinite=NonfiniteOrigin.from_json(data["nonfinite"])
            if data.get("nonfinite")
            else None,
            rank=data.get("rank"),
            world_size=data.get("world_size"),
            ranks=tuple(RankSummary.from_json(r) for r in data.get("ranks", ())),
            job_reruns=tuple(JobRerun.from_json(r) for r in data.get("job_reruns", ())),
            torch_compile=CompileVerdict.from_json(data["torch_compile"])
            if data.get("torch_compile")
            else None,
            memory=MemoryReport.from_json(data["memory"]) if data.get("memory") else None,
            launch=location_from_json(data.get("launch")),
            after_loop=AfterLoop.from_json(data.get("after_loop")),
        )

    def with_notes(self, *notes: str) -> Failure:
        return replace(self, notes=(*self.notes, *notes))


@dataclass(frozen=True, slots=True)
class RunDir:
    """One recording's folder."""

    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def failure_path(self) -> Path:
        return self.path / FAILURE_FILE

    @property
    def meta_path(self) -> Path:
        return self.path / META_FILE

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE_FILE

    @property
    def launch_probe_path(self) -> Path:
        return self.path / LAUNCH_PROBE_FILE

    @property
    def inputs_path(self) -> Path:
        return self.path / INPUTS_FILE

    def recorded_traceback(self) -> str:
        """The traceback of the recorded run's failure ("" when none was kept): its frames are
        the failing stack, which a script reduction would otherwise run the script to read."""
        try:
            outcome = json.loads((self.path / RECORD_OUTCOME_FILE).read_text())
        except (OSError, ValueError):
            return ""
        return str(outcome.get("traceback") or "") if isinstance(outcome, dict) else ""

    @classmethod
    def create(cls, root: Path = DEFAULT_ROOT, name: str | None = None) -> RunDir:
        runs = root / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        ignore = root / ".gitignore"  # captured tensors must never end up in a commit
        if not ignore.exists():
            atomic_write(ignore, GITIGNORE)
        stem = name or time.strftime("%Y%m%d-%H%M%S")
        path, n = runs / stem, 1
        while path.exists():
            n += 1
            path = runs / f"{stem}-{n}"
        path.mkdir()
        atomic_write(root / "latest", path.name)
        return cls(path.resolve())

    @classmethod
    def latest(cls, root: Path = DEFAULT_ROOT) -> RunDir:
        pointer = root / "latest"
        if not pointer.exists():
            raise NoRecordingError(
                f"no recording found under {root}/",
                hint="run `reprocut record your_script.py` first, or pass a run directory",
            )
        return cls.open(root / "runs" / pointer.read_text().strip())

    @classmethod
    def open(cls, path: Path) -> RunDir:
        if not path.is_dir():
            raise NoRecordingError(
                f"{path} is not a recording directory",
                hint="pass a folder under .reprocut/runs/, or run `reprocut record` first",
            )
        return cls(path.resolve())

    def write_meta(self, meta: dict[str, Any]) -> None:
        atomic_write(self.meta_path, json.dumps(meta, indent=2))

    def read_meta(self) -> dict[str, Any]:
        return self._read_json(self.meta_path)

    def write_failure(self, failure: Failure) -> None:
        atomic_write(self.failure_path, json.dumps(failure.to_json(), indent=2, allow_nan=False))

    def read_failure(self) -> Failure:
        if not self.failure_path.exists():
            raise NoRecordingError(
                f"{self.path} holds no failure ({FAILURE_FILE} is missing)",
                hint="the run may not have failed, or was interrupted: run `reprocut record` again",
            )
        data = self._read_json(self.failure_path)
        try:
            return Failure.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordingError(
                f"{self.failure_path} is not a valid recording: {exc!r}",
                hint="record the script again with `reprocut record`",
            ) from exc

    def read_trace(self) -> Iterator[dict[str, Any]]:
        """The completed steps, tolerating a torn last line from a crashed process."""
        if not self.trace_path.exists():
            return
        with self.trace_path.open() as lines:
            for raw in lines:
                try:
                    yield json.loads(raw)
                except json.JSONDecodeError:
                    return

    def _read_json(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise NoRecordingError(f"{path} is missing") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CorruptRecordingError(
                f"{path} is corrupt: {exc}", hint="record the script again with `reprocut record`"
            ) from exc
        if not isinstance(data, dict):
            raise CorruptRecordingError(f"{path} is corrupt: expected a JSON object")
        return data


_WRITES = itertools.count()  # each write's temporary file is its own


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file. The
    temporary file is this call's own: two writes of one file at once (threads, or a signal
    handler's write inside the main thread's) never write into each other's."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_WRITES)}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
