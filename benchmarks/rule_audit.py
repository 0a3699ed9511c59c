"""This checkout's static rules held against the verdicts a device gave its reductions' checks.

A check log (`REPROCUT_CHECK_LOG`; `bench_faults.py --logs DIR` keeps one per shrink) holds each
script candidate's text and verdict, and its reduction's rules and accepted bests. Each checked
candidate is held to this checkout's validity rules (reprocut.source.validity) against the best
of its time, as the reducer would before running it:

- `would skip`: the checks the rules now reject unrun, by the verdict they had there;
- `reproduced`: of those, the ones that reproduced the failure, each listed with its rule. A
  rule that says a candidate cannot reproduce (it raises first, cannot compile, cannot fault)
  must have none: the command fails on one. The rules that keep a repro the user's bug (a
  seed kept, no CPU pointer, no device move, no new grid, the custom op kept) reject some
  that reproduce, by design; theirs are listed apart.

The custom-op rules are left out (they read the user's modules, which the log does not hold).
No GPU is needed: the verdicts are the log's.

    python benchmarks/rule_audit.py LOG... [--out benchmarks/results/rule-audit-cuda.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reprocut.source.validity import Rules  # noqa: E402

# the rules that keep a repro the user's bug rather than predict a verdict (reprocut.source.validity)
POLICY = ("random tensors without a seed", "a CPU tensor", "the pointer of a temporary",
          "moved off its device", "launch ", "no longer registered", "no longer called")  # fmt: skip


def is_policy(rule: str) -> bool:
    return rule.startswith(POLICY) or " no longer " in rule


@dataclass
class Audit:
    """One log's checks held to the rules."""

    name: str
    checks: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # verdict -> checks now rejected
    rules: Counter[str] = field(default_factory=Counter)  # the first broken rule -> checks
    reproduced: list[tuple[str, str]] = field(default_factory=list)  # (rule, first lines)

    @property
    def contradicted(self) -> list[tuple[str, str]]:
        """The reproduced checks a predicting rule rejects: that rule is wrong."""
        return [(rule, head) for rule, head in self.reproduced if not is_policy(rule)]


def audit(path: Path) -> Audit:
    """Hold each logged script check to the rules of this checkout."""
    found = Audit(path.name.removesuffix(".jsonl").removesuffix(".shrink.checks"))
    rules: Rules | None = None
    best = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed process
        kind = event.get("kind")
        if kind == "rules" and event.get("reducer") == "source":
            rules = Rules(memory_fault=bool(event.get("memory_fault")), focus=event.get("focus"))
            best = event.get("code") or ""
        elif kind == "accepted" and event.get("reducer") == "source" and "code" in event:
            best = event["code"]
        elif kind == "check" and rules is not None and "code" in event:
            code = event["code"]
            if code == best:
                continue  # the original's check, or the best's own
            found.checks += 1
            broken = rules.rejects(code, best)
            if not broken:
                continue
            verdict = event.get("verdict", "?")
            found.skipped[verdict] += 1
            found.rules[broken[0]] += 1
            if verdict == "Reproduced":
                found.reproduced.append((broken[0], "\n".join(code.splitlines()[:3])))
    return found


def report(audits: list[Audit], command: str) -> str:
    lines = [
        "# Static rules against the verdicts of logged reductions",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {_commit()}, "
        f"Python {sys.version.split()[0]}; no GPU needed. Command: `{command}`.",
        "",
        "`checks`: the script candidates each log's reduction ran; `would skip`: those this",
        "checkout's rules reject unrun, by their verdict in the log; `reproduced`: of those, the",
        "ones that reproduced. A rule that predicts a verdict (raises, cannot compile, cannot",
        "fault) must reject none that reproduced; a rule that keeps the repro the user's bug (a",
        "seed kept, no CPU pointer, no new grid) may, by design. A check whose candidate the",
        "rules of the logged run rejected was never run, so it is not here.",
        "",
        "| log | checks | would skip | by verdict | reproduced | of them, by a predicting rule |",
        "|---|---|---|---|---|---|",
    ]
    for found in audits:
        verdicts = ", ".join(f"{k} {v}" for k, v in found.skipped.most_common())
        lines.append(f"| {found.name} | {found.checks} | {sum(found.skipped.values())} | "
                     f"{verdicts} | {len(found.reproduced)} | {len(found.contradicted)} |")  # fmt: skip
    rules = Counter[str]()
    for found in audits:
        rules.update(found.rules)
    if rules:
        lines += ["", "| rule (the first a candidate breaks) | checks |", "|---|---|"]
        lines += [f"| {rule[:90]} | {n} |" for rule, n in rules.most_common(20)]
    for title, policy in (("by a predicting rule (wrong)", False), ("by a policy rule", True)):
        listed = [(found.name, rule, head) for found in audits for rule, head in found.reproduced
                  if is_policy(rule) == policy]  # fmt: skip
        if listed:
            lines += ["", f"Rejected though they reproduced, {title}:", ""]
            lines += [
                f"- {name}: {rule}: `{head.splitlines()[0][:80]}`" for name, rule, head in listed
            ]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    return done.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="check logs (JSON lines)")
    parser.add_argument("--out", type=Path, default=None, help="write the report here too")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.logs if not p.is_file()]
    if missing:
        print(f"rule_audit: no such log: {', '.join(missing)}", file=sys.stderr)
        return 2
    audits = [audit(path) for path in args.logs]
    text = report(audits, "python benchmarks/rule_audit.py " + " ".join(p.name for p in args.logs))
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 1 if any(found.contradicted for found in audits) else 0


if __name__ == "__main__":
    raise SystemExit(main())
