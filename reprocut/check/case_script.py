"""A ReproCase as the script its check runs, and the file it runs from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reprocut.model.case import ReproCase
from reprocut.shrink.emitter import Emitted, emit, inline_captured
from reprocut.shrink.header import Header


def emitted_case(case: ReproCase, inputs: Mapping[str, Any] | None = None) -> Emitted:
    """`case` as the script its check runs (captured values inlined where small)."""
    return emit(inline_captured(case, inputs) if inputs else case, Header(expected=case.expected))


def case_filename(case: ReproCase, code: str, folder: Path) -> Path:
    """The file a check of `case` runs: one per candidate for a custom op's code."""
    return folder / (f"repro_{abs(hash(code)):x}.py" if case.definitions else "repro.py")
