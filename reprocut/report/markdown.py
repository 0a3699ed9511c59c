"""report.md: a failure, its repro and its environment, ready to paste into a GitHub issue.

The environment is collect_env-style versions (torch, CUDA, driver, GPU, Python, OS) from the
recording and `nvidia-smi`, and those of the frameworks the script had imported; never
environment variables, paths to secrets or hostnames. Paths are relative to the script's folder,
and the home directory is never named.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

from reprocut.model.case import SourceLocation
from reprocut.model.nonfinite import NonfiniteOrigin
from reprocut.model.notebook import place_of
from reprocut.model.recording import Failure
from reprocut.report.compiled import compile_markdown
from reprocut.report.memory_markdown import memory_markdown
from reprocut.report.paths import relative_to_folder, shown_path
from reprocut.shrink.header import Environment


def _nvidia_smi() -> tuple[str | None, str | None]:
    """(driver, GPU name) without initialising CUDA in this process."""
    if shutil.which("nvidia-smi") is None:
        return None, None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    first = out.strip().splitlines()[0] if out.strip() else ""
    if "," not in first:
        return None, None
    driver, name = (part.strip() for part in first.split(",", 1))
    return driver or None, name or None


def collect_environment(failure: Failure | None = None) -> Environment:
    """Versions of the machine the failure was recorded on (falling back to this one: importing
    torch only then, as a shrink's own process needs no torch to reduce a script)."""
    env = dict(failure.env) if failure is not None else {}
    torch_version, cuda = env.get("torch"), env.get("cuda")
    if not (torch_version and cuda):
        import torch

        torch_version, cuda = torch_version or torch.__version__, cuda or torch.version.cuda
    on_cuda = failure is not None and failure.device.startswith("cuda")
    driver, gpu = _nvidia_smi() if on_cuda else (None, None)
    return Environment(
        torch=torch_version,
        cuda=None if cuda in (None, "None") else str(cuda),
        driver=env.get("driver") or driver,
        gpu=env.get("gpu") or gpu,
        python=env.get("python") or platform.python_version(),
        os=env.get("platform") or platform.platform(terse=True),
    )


@dataclass(frozen=True, slots=True)
class ReportInputs:
    """Everything report.md says, gathered by the shrink command."""

    code: str
    failure: Failure
    environment: Environment
    statements: int
    tensor_elements: int | None
    checks: int
    seconds: float
    verified_runs: int
    verified_reproduced: int
    cpu_reproduces: bool | None
    cpu_message: str = ""
    reproduced_from_capture: bool = True
    sidecar: bool = False
    notes: tuple[str, ...] = ()  # what else the shrink did (a walk-back), one sentence each
    sanitizer: str = ""  # compute-sanitizer's evidence as markdown (reprocut.check.sanitizer)
    same_bug: str = ""  # the fingerprints side by side (reprocut.model.fingerprint.SameBug)
    repro_message: str = ""  # what the repro's plain runs printed ("": not read)


def _fence(text: str, language: str = "") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{language}\n{text.rstrip()}\n{fence}"


def summary_line(failure: Failure) -> str:
    signature = failure.signature
    where = failure.public_call or failure.op or failure.kernel or "a torch call"
    if failure.torch_compile is not None and failure.torch_compile.fails_eagerly is False:
        where = f"torch.compile({', '.join(failure.torch_compile.used)})"
    if signature.error_code is not None:
        name = failure.error.name or signature.kind
        return f"`{where}` raises CUDA error {signature.error_code} ({name}): {signature.kind}"
    return f"`{where}` raises {signature.error_type}: {signature.kind}"


def nonfinite_lines(origin: NonfiniteOrigin) -> list[str]:
    """Where the NaN/inf came from, how it spread and where the run ended, as markdown."""
    what = "NaN" if origin.kind == "nan" else "inf"
    lines = ["## Where the NaN/inf came from", ""]
    lines.append(f"- made by `{origin.op}` ({what}, {origin.how}) at step {origin.step}, "
                 f"{origin.phase}" + (f", module `{origin.module}`" if origin.module else ""))  # fmt: skip
    if origin.source is not None:
        lines.append(f"- line `{origin.source.file}:{origin.source.line}`: `{origin.source.text}`")
    if origin.autograd_node:
        lines.append(f"- in the backward of `{origin.autograd_node}`")
    lines += [f"- {fact}" for fact in origin.facts]
    if origin.chain:
        lines.append("- then: " + " → ".join(f"`{link.op}`" for link in origin.chain))
    if origin.ended is not None:
        lines.append(f"- the run: {origin.ended.message}")
    return lines


def expected_error(failure: Failure, repro_message: str) -> list[str]:
    """The error the repro ends in, as its plain runs printed it; the original program's
    beside it, labelled as the original's, where the shrink changed it."""
    original = failure.error.message.strip()
    shown = repro_message.strip() or original
    lines = ["## Expected error", "", _fence(f"{failure.error.type}: {shown}")]
    if shown.splitlines()[:1] != original.splitlines()[:1]:
        lines += ["", "The original program's error (before shrinking):", ""]
        lines.append(_fence(f"{failure.error.type}: {original}"))
    seen = failure.error.surfaced_as
    if seen:
        lines += ["", "What the original program raised instead (the error reached it as another "
                  "one; the op's own error is above):", ""]  # fmt: skip
        lines.append(_fence(f"{seen.get('type', '')}: {str(seen.get('message', '')).strip()}"))
    return lines


def render(inputs: ReportInputs) -> str:
    failure, env = inputs.failure, inputs.environment
    parts = [f"# {summary_line(failure)}", ""]
    if not inputs.reproduced_from_capture:
        parts += [
            "> **Note:** the captured call did not reproduce the failure on its own; the script "
            "below is the unshrunk candidate. Try `reprocut shrink --source` (source-level "
            "reduction of the original script).",
            "",
        ]
    parts += ["## Reproduction", "", _fence(inputs.code, "python"), ""]
    if inputs.sidecar:
        parts += ["It loads captured inputs from `repro_inputs.pt` (attached next to it).", ""]
    size = f"{inputs.statements} statements"
    if inputs.tensor_elements is not None:
        size += f", {inputs.tensor_elements} tensor elements"
    parts += [
        f"Run it with `python repro.py`. Size: {size}. Reduced by reprocut in "
        f"{inputs.checks} checks, {inputs.seconds:.1f} s. Verified: "
        f"{inputs.verified_reproduced}/{inputs.verified_runs} plain runs failed as expected.",
        "",
        *(f"> {note}\n" for note in inputs.notes),
        *expected_error(failure, inputs.repro_message),
        "",
        f"Signature: {failure.signature.describe()}",
    ]
    for assertion in failure.error.assertions[:3]:
        text = assertion.get("condition") if isinstance(assertion, dict) else str(assertion)
        function = assertion.get("function", "") if isinstance(assertion, dict) else ""
        parts.append(f"- kernel assertion: `{text}`" + (f" in `{function}`" if function else ""))
    if inputs.cpu_reproduces is not None:
        cpu = "yes" if inputs.cpu_reproduces else "no"
        parts.append(
            f"- on CPU: {cpu}" + (f" (`{inputs.cpu_message}`)" if inputs.cpu_message else "")
        )
    parts += ["", "## Where it happened in the original program", ""]
    folder = os.path.dirname(failure.script) if failure.script else ""
    if failure.test is not None:  # under pytest: paths from where pytest ran
        folder = failure.cwd
        test_line = f"{shown_path(failure.test.file, folder)}:{failure.test.line}"
        parts.append(f"- test `{failure.test.nodeid}` (its line: `{test_line}`)")
    if failure.rank is not None:
        parts.append(
            f"- rank {failure.rank} of {failure.world_size} under torchrun (the first to fail; "
            "the repro above is single-process, with that rank's inputs)"
        )
    if failure.launch is not None:  # a custom op: its implementation's line, then the call
        inside = f" (inside `{failure.op}`)" if failure.op else ""
        parts.append(f"- {_line(failure.launch, folder)}{inside}")
    if failure.source is not None:
        called = "called from " if failure.launch is not None else ""
        parts.append(f"- {called}{_line(failure.source, folder)}")
    if failure.forward_source is not None:
        parts.append(f"- created in forward at {_line(failure.forward_source, folder)}")
    if failure.call_site is not None and (failure.call_site.file, failure.call_site.line) != (
        (failure.source.file, failure.source.line) if failure.source else None
    ):
        parts.append(f"- torch called from {_line(failure.call_site, folder)}")
    facts = [
        ("op", failure.op),
        ("kernel (not a PyTorch op)", failure.kernel),
        ("public call", failure.public_call),
        ("module", failure.module),
        ("phase", failure.phase),
        ("training step", failure.step if failure.test is None else None),
        ("when", failure.after_loop.describe() if failure.after_loop else None),
    ]
    parts += [f"- {name}: `{value}`" for name, value in facts if value is not None]
    if failure.loop:
        counters = ", ".join(f"{name}={value}" for name, value in failure.loop.items())
        parts.append(f"- your loop counters: `{counters}`")
    parts += [f"- `{row.name}`: {fact}" for row in failure.tensors for fact in row.facts]
    if failure.nonfinite is not None:
        parts += ["", *nonfinite_lines(failure.nonfinite)]
    if failure.torch_compile is not None:
        parts += ["", *compile_markdown(failure.torch_compile)]
    if failure.diagnosis:
        parts += ["", failure.diagnosis]
    if failure.memory is not None:  # an out-of-memory failure: the request, holders, leak
        parts += ["", *memory_markdown(failure.memory, folder)]
    if inputs.same_bug:
        parts += ["", "## Same bug?", "", inputs.same_bug.rstrip()]
    if inputs.sanitizer:
        parts += ["", "## compute-sanitizer", "", inputs.sanitizer.rstrip()]
    parts += [
        "",
        "## Environment",
        "",
        f"- PyTorch: {env.torch}",
        f"- CUDA: {env.cuda or 'none'}",
        f"- GPU driver: {env.driver or 'none'}",
        f"- GPU: {env.gpu or 'none'}",
        f"- Python: {env.python}",
        f"- OS: {env.os}",
        *(f"- {name}: {version}" for name, version in sorted(failure.frameworks.items())),
        "",
    ]
    return relative_to_folder("\n".join(parts), folder)


def _line(location: SourceLocation, folder: str) -> str:
    """`` `file:line`: `text` `` with the file relative to the script's folder."""
    place = place_of(location.file, location.line)
    if place is not None:
        where = f"`{place.describe(folder)}`"
        return f"{where}: `{location.text}`" if location.text else where
    where = f"`{shown_path(location.file, folder)}:{location.line}`"
    return f"{where}: `{location.text}`" if location.text else where
