"""The facts audit: what reprocut's outputs claim about a corpus case, against its ground truth.

Each case.toml lists facts that must appear and facts that must not, as regular expressions
over what reprocut printed for it (issue 34: a fact that is false, or true but irrelevant, reads
as a clue in a bug report):

    [audit]                       # every output that exists
    must = ["index max 79 ≥ 64 rows"]
    must_not = ["not contiguous", "int32 offsets? wrap"]
    [audit.json]                  # one output: panel, json, report or repro
    must = ['"op": "aten::embedding"']
    [audit.cpu]                   # one device (and [audit.cpu.json] ...)
    must_not = ['"op": null']

The outputs: `panel` (the record panel, drawn from failure.json as a 100-column terminal shows
it), `json` (`record --json`, then `shrink --json`), `report` (report.md) and `repro`
(repro.py), the last two only when the case was shrunk. Each is read as one line: the panel's
borders dropped and every run of whitespace made one space, so a rule matches across wrapped
lines. A `must` rule without an output holds in the panel, json and report (a repro's header
says less), a `must_not` rule in every output. Each (rule, output) pair is one fact checked.
Pure functions: no subprocess, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

OUTPUTS = ("panel", "json", "report", "repro")
MUST_OUTPUTS = ("panel", "json", "report")  # where a must rule without an output is read
DEVICES = ("cpu", "cuda")
BORDERS = re.compile(r"[│╭╮╰╯─┃┏┓┗┛━┡┩╇┳┻┣┫╋]")


class AuditFormatError(ValueError):
    """An [audit] table that is not lists of valid regular expressions."""


@dataclass(frozen=True, slots=True)
class AuditRule:
    pattern: str
    must: bool  # True: must appear; False: must not
    output: str | None = None  # None: every output (must: panel, json, report)
    device: str | None = None  # None: every device

    def outputs(self) -> tuple[str, ...]:
        if self.output is not None:
            return (self.output,)
        return MUST_OUTPUTS if self.must else OUTPUTS

    def describe(self, output: str) -> str:
        return f"{output}: {'missing' if self.must else 'false'} /{self.pattern}/"


@dataclass(frozen=True, slots=True)
class AuditResult:
    checked: int  # (rule, output) pairs read
    false: tuple[str, ...] = ()  # must_not rules that matched: false facts printed
    missing: tuple[str, ...] = ()  # must rules that did not: facts the output lacks

    @property
    def right(self) -> bool:
        return not self.false and not self.missing


def load_rules(table: dict[str, Any], where: str = "[audit]") -> tuple[AuditRule, ...]:
    """Rules of a case.toml `[audit]` table (its output and device sub-tables too)."""
    return tuple(_rules(table, where, None, None))


def _rules(table: Any, where: str, output: str | None, device: str | None) -> list[AuditRule]:
    if not isinstance(table, dict):
        raise AuditFormatError(f"{where} must be a table")
    rules = []
    for key, value in table.items():
        if key in ("must", "must_not"):
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise AuditFormatError(f"{where}.{key} must be a list of strings")
            for pattern in value:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise AuditFormatError(f"{where}.{key}: /{pattern}/: {exc}") from exc
                rules.append(AuditRule(pattern, key == "must", output, device))
        elif key in OUTPUTS and output is None:
            rules += _rules(value, f"{where}.{key}", key, device)
        elif key in DEVICES and device is None and output is None:
            rules += _rules(value, f"{where}.{key}", None, key)
        else:
            raise AuditFormatError(f"{where}: unknown key {key!r}")
    return rules


def normalized(text: str, output: str) -> str:
    """One line: a panel's borders dropped, every run of whitespace one space."""
    if output == "panel":
        text = BORDERS.sub(" ", text)
    return " ".join(text.split())


def audit(rules: tuple[AuditRule, ...], device: str, outputs: dict[str, str]) -> AuditResult:
    """Read every rule that applies to `device` against each output it names that exists."""
    texts = {name: normalized(text, name) for name, text in outputs.items() if text}
    checked, false, missing = 0, [], []
    for rule in rules:
        if rule.device not in (None, device):
            continue
        for output in rule.outputs():
            if output not in texts:
                continue
            checked += 1
            found = re.search(rule.pattern, texts[output]) is not None
            if found != rule.must:
                (missing if rule.must else false).append(rule.describe(output))
    return AuditResult(checked, tuple(false), tuple(missing))
