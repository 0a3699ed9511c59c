"""The torch.compile verdict: does the failure need the compiler?

record runs a script that used torch.compile eagerly (ops inside compiled graphs never reach
the dispatch modes), so it also runs it once as the user did, compiled and without hooks. What
that run showed (the error, the Inductor kernel's assertion and name, a crash) and what the
eager run showed decide the verdict: the failure happens eagerly too (the user's own bug, the
compiler not involved) or only compiled (a likely compiler bug, or a custom op's fake
implementation that disagrees with the real one).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMPILE_ONLY = "compile-only"  # Failure.status of a failure only the compiled script shows

# The assertion an Inductor kernel makes on an index: `index out of bounds: 0 <= tmp4 < 2048`
# (Triton's device assert on the GPU, a C++ exception on the CPU).
_INDUCTOR_ASSERT = re.compile(r"index out of bounds: [^\n]*?<=? ?\w+ <=? ?[\w.]+")
# Inductor's generated kernels: `triton_poi_fused_embedding_0`, `cpp_fused_embedding_sum_0`
_KERNEL_NAME = re.compile(r"\b((?:triton|cpp)_(?:poi|red|per|tem|fused)\w*)\b")
# a device-side assert's line names its kernel: "...py:45: triton_poi_fused_embedding_0: block: [..."
_ASSERTING_KERNEL = re.compile(r": ((?:triton|cpp)_\w+): block: \[")
# the assert's site in a generated file: "/tmp/torchinductor_root/ro/cror....py:28: unknown: block: ["
_ASSERT_SITE = re.compile(r"(?P<file>\S*torchinductor\S*?\.py):(?P<line>\d+): [^:\n]*: block: \[")
_KERNEL_DEF = re.compile(r"\s*def ((?:triton|cpp)_\w+)\(")
# a CUDA error: reported at a later API call than the launch that faulted
_CUDA_ERROR = re.compile(
    r"CUDA error|CUDA_ERROR|cudaError|Triton Error \[CUDA\]|illegal memory access|"
    r"misaligned address|device-side assert|unspecified launch failure"
)
# a file under Inductor's cache: /tmp/torchinductor_<user>/ih/cihu3e...main.cpp:29
_CACHE_FILE = re.compile(
    r"(?P<file>[^\s\"',]*torchinductor[^\s\"',:]*?\.(?:py|cpp))(?::(?P<line>\d+))?"
)


@dataclass(frozen=True, slots=True)
class CompiledRun:
    """One run of the script as the user ran it: compiled, no reprocut code in the process."""

    failed: bool
    error_type: str | None = None  # None for a crash or a pass
    message: str = ""
    returncode: int | None = None  # None on a timeout
    crashed: bool = False  # died without a Python traceback (SIGABRT from a C++ exception)
    timed_out: bool = False
    kernel: str | None = None  # the Inductor-generated kernel named in the output
    assertion: str | None = None  # "index out of bounds: 0 <= tmp4 < 2048"
    kernel_file: str | None = None  # its file under the Inductor cache
    seconds: float = 0.0

    def describe(self) -> str:
        if self.timed_out:
            return "timed out"
        if not self.failed:
            return "passed"
        if self.crashed:
            return f"crashed ({_how(self.returncode)}, no Python traceback)"
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        first = _CACHE_FILE.sub("<generated kernel file>", first)
        return f"{self.error_type}: {first}" if first else str(self.error_type)

    def to_json(self) -> dict[str, Any]:
        return {
            "failed": self.failed,
            "error_type": self.error_type,
            "message": self.message,
            "returncode": self.returncode,
            "crashed": self.crashed,
            "timed_out": self.timed_out,
            "kernel": self.kernel,
            "assertion": self.assertion,
            "kernel_file": self.kernel_file,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompiledRun:
        return cls(
            failed=bool(data.get("failed")),
            error_type=data.get("error_type"),
            message=data.get("message", ""),
            returncode=data.get("returncode"),
            crashed=bool(data.get("crashed")),
            timed_out=bool(data.get("timed_out")),
            kernel=data.get("kernel"),
            assertion=data.get("assertion"),
            kernel_file=data.get("kernel_file"),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class CompileVerdict:
    """What `record` says about torch.compile (`--json` `torch_compile`)."""

    used: tuple[str, ...]  # what was compiled: "TinyLM", "forward", "torch._dynamo.optimize"
    fails_eagerly: bool | None  # None: the compiled run was skipped
    eager: str = ""  # the eager failure in words: "IndexError in aten::embedding at train.py:31"
    compiled: CompiledRun | None = None
    inductor_settings: dict[str, str] = field(default_factory=dict)  # differing from defaults
    versions: dict[str, str] = field(default_factory=dict)  # torch, triton
    # each compiled callable's first call in the recording: its arguments' specs as JSON
    first_calls: dict[str, tuple[dict[str, Any] | None, ...]] = field(default_factory=dict)

    def summary(self) -> str:
        if self.fails_eagerly is None:
            return "torch.compile was used; the compiled run was skipped (--no-compiled-run)"
        if self.fails_eagerly:
            return "fails eagerly too: the compiler is not involved (the repro runs eagerly)"
        return "fails only compiled: a likely compiler bug (the repro calls torch.compile)"

    def to_json(self) -> dict[str, Any]:
        compiled = self.compiled
        return {
            "used": True,
            "compiled": list(self.used),
            "fails_eagerly": self.fails_eagerly,
            "eager": self.eager,
            "kernel": None if compiled is None else compiled.kernel,
            "assertion": None if compiled is None else compiled.assertion,
            "compiled_run": None if compiled is None else compiled.to_json(),
            "inductor_settings": dict(self.inductor_settings),
            "versions": dict(self.versions),
            "first_calls": {name: list(specs) for name, specs in self.first_calls.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompileVerdict:
        run = data.get("compiled_run")
        return cls(
            used=tuple(data.get("compiled", ())),
            fails_eagerly=data.get("fails_eagerly"),
            eager=data.get("eager", ""),
            compiled=None if run is None else CompiledRun.from_json(run),
            inductor_settings={
                str(k): str(v) for k, v in data.get("inductor_settings", {}).items()
            },
            versions={str(k): str(v) for k, v in data.get("versions", {}).items()},
            first_calls={str(k): tuple(v) for k, v in (data.get("first_calls") or {}).items()},
        )


def compile_environment(compiled: bool) -> dict[str, str]:
    """This process's environment with torch.compile on (`compiled`) or off, whatever the shell
    had: the two ways a compile-only failure is told apart."""
    env = dict(os.environ)
    env.pop("TORCH_COMPILE_DISABLE", None)
    if not compiled:
        env["TORCH_COMPILE_DISABLE"] = "1"
    return env


def inductor_evidence(output: str) -> tuple[str | None, str | None, str | None]:
    """(kernel name, assertion, kernel file) an Inductor-generated kernel left in `output`.

    The kernel named is the one the failure happened in, never one that merely ran nearby. A
    device-side assert's line names the generated file and line; Triton prints `unknown` where
    the kernel's name would stand, so the name is read from that file, whose `def` encloses the
    line (Inductor leaves its cache on disk). Without such a line, the traceback's deepest
    generated kernel raised its own error only on the CPU: a CUDA error surfaces at whatever
    launch comes after the faulting one (on the H200 a custom op's Triton kernel read out of
    bounds inside a compiled model, and the traceback named the Inductor kernel launched next)."""
    assertion = _INDUCTOR_ASSERT.search(output)
    named = _ASSERTING_KERNEL.findall(output)[:1]
    cache = list(_CACHE_FILE.finditer(output))
    asserting = _ASSERT_SITE.search(output)
    kernel_file = cache[-1]["file"] if cache else None  # the deepest: the kernel's own file
    if asserting:
        kernel_file = asserting["file"]
        if not named:  # the file is read only when the assert's line names no kernel
            defined = kernel_defined_at(Path(kernel_file), int(asserting["line"]))
            named = [defined] if defined else []
    if named:
        kernel: str | None = named[0]
    elif _CUDA_ERROR.search(output):
        kernel = None  # it surfaced at a later launch: that kernel is a bystander
    else:
        kernel = next(reversed(_KERNEL_NAME.findall(output)), None)  # it raised synchronously
    return kernel, assertion.group(0).strip() if assertion else None, kernel_file


def kernel_defined_at(source: Path, line: int) -> str | None:
    """The generated kernel whose `def` encloses `line` of `source`, if the file is readable."""
    try:
        lines = source.read_text().splitlines()[:line]
    except (OSError, UnicodeDecodeError):
        return None
    for text in reversed(lines):
        found = _KERNEL_DEF.match(text)
        if found:
            return found[1]
    return None


def normalize_inductor(message: str) -> str:
    """An Inductor kernel's message with what changes from one compile to the next taken out:
    the cache file (a hash) and the temporaries' numbers (`tmp13`)."""
    message = _CACHE_FILE.sub("<inductor kernel>", message)
    return re.sub(r"\btmp\d+\b", "tmp", message)


def _how(returncode: int | None) -> str:
    if returncode is None:
        return "no exit code"
    return f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
