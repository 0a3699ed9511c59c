"""The fingerprint of a bug: what a repro must share with the user's failure to be that bug.

The signature (error code or type, op, assertion kind) holds that line for device-side asserts,
exceptions and NaN origins. A memory fault's error code says little: a shrink can slide from a
read past the end of `table` to a read of a host pointer, both error 700. Its fingerprint is
what compute-sanitizer memcheck saw: the faulting kernel, the access (read, write, atomic) and
its size, and where the address falls relative to the allocation it missed (past the end of,
before the start of, misaligned inside). `SameBug` is the verdict report.md and `--json` give:
the original's fingerprint and the repro's side by side, and which checks were skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from reprocut.model.case import Signature

PAST_END = "past the end of"
BEFORE_START = "before the start of"
MISALIGNED = "misaligned inside"
INSIDE = "inside"
RELATIONS = (PAST_END, BEFORE_START, MISALIGNED, INSIDE)
OUT_OF_BOUNDS = "out of bounds"
SAME, DIFFERS, UNKNOWN = "same", "differs", "unknown"  # one part of two fingerprints compared
LAYOUT = "expected when the allocation layout changes"
# what the comparison looks at: an address between two allocations is "past the end of" the one
# below or "before the start of" the one above, whichever memcheck finds nearer, and that depends
# on the layout of the run (on the H200 a Triton read past an expand()ed gate's storage showed
# as "before the start of" the next tensor); the side is shown, the class compared
_CLASS = {
    PAST_END: OUT_OF_BOUNDS,
    BEFORE_START: OUT_OF_BOUNDS,
    MISALIGNED: MISALIGNED,
    INSIDE: INSIDE,
}


def location_class(relation: str | None) -> str | None:
    """out of bounds, misaligned or inside: what two fingerprints must share."""
    return None if relation is None else _CLASS.get(relation, relation)


_SIGNATURE_HEAD = re.compile(r"^(?:void\s+)?(?P<name>[^(<]+)")


def kernel_key(name: str | None) -> str | None:
    """A kernel's name without return type, template and argument lists, namespaces kept:
    `void at::native::foo<float, long>(...)` -> `at::native::foo`; `add_kernel` stays."""
    if not name:
        return None
    anonymous = "(anonymous namespace)"
    match = _SIGNATURE_HEAD.match(name.strip().replace(anonymous, "\0"))
    head = match["name"].strip() if match else name.strip()
    return head.replace("\0", anonymous)


@dataclass(frozen=True, slots=True)
class MemoryFingerprint:
    """One memory fault as memcheck reported its first access error."""

    kernel: str | None  # kernel_key of the faulting kernel; an aten op's name for aten kernels
    access: str | None  # the first error's: "read", "write", "atomic"
    size: int | None  # bytes per access
    relation: str | None  # one of RELATIONS; None: memcheck named no allocation near it
    target: str = ""  # the tensor or allocation named (shown, not compared: names change)
    by_kernel: bool = True  # False: an aten op's kernel, chosen by shape
    accesses: tuple[str, ...] = ()  # every kind among the errors memcheck printed

    def compared(self) -> tuple[str, ...]:
        """The fields two fingerprints are compared on (the relation by its location_class).
        The access kinds match when the errors
        share one (threads report in no fixed order: a kernel that reads and writes out of
        bounds may show either first). The size counts for a misaligned access only, where the
        vector width is the bug; out of bounds it is the compiler's choice (Triton vectorizes
        by the arguments' alignment: 4 B in one run, 16 B in another)."""
        fields = ("kernel", "access", "relation")
        return (*fields, "size") if self.relation == MISALIGNED else fields

    def differences(self, other: MemoryFingerprint) -> tuple[list[str], list[str]]:
        """(fields that differ, fields that could not be compared: unknown on either side)."""
        differ, unknown = [], []
        for name in self.compared():
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is None or theirs is None:
                unknown.append(name)
            elif name == "access":
                if not set(self.accesses or (mine,)) & set(other.accesses or (theirs,)):
                    differ.append(name)
            elif name == "relation":
                if location_class(mine) != location_class(theirs):
                    differ.append(name)
            elif mine != theirs:
                differ.append(name)
        return differ, unknown

    def same_bug(self, other: MemoryFingerprint) -> bool:
        return not self.differences(other)[0]

    def parts(self, other: MemoryFingerprint) -> tuple[tuple[str, str], ...]:
        """Each part of the fingerprint against `other`'s: the kernel, the access kind, its
        size and the address relation, each SAME, DIFFERS or UNKNOWN. The relation's side
        counts here (before the start of one allocation is not past the end of another) though
        the verdict compares its class only; the size is shown even where it is not compared."""
        mine_kinds = set(self.accesses or ((self.access,) if self.access else ()))
        their_kinds = set(other.accesses or ((other.access,) if other.access else ()))
        access = _part(self.access, other.access, bool(mine_kinds & their_kinds))
        return (
            ("kernel", _part(self.kernel, other.kernel, self.kernel == other.kernel)),
            ("access", access),
            ("size", _part(self.size, other.size, self.size == other.size)),
            ("address", _part(self.relation, other.relation, self.relation == other.relation)),
        )

    def describe(self) -> str:
        """`read of 4 B in add_cond_kernel, past the end of `bias``."""
        access = f"{self.access or 'access'}" + (f" of {self.size} B" if self.size else "")
        where = f", {self.relation} {self.target}".rstrip() if self.relation else ""
        return f"{access} in {self.kernel or 'an unnamed kernel'}{where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "access": self.access,
            "size": self.size,
            "relation": self.relation,
            "target": self.target,
            "by_kernel": self.by_kernel,
            "accesses": list(self.accesses),
            "text": self.describe(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryFingerprint:
        return cls(data.get("kernel"), data.get("access"), data.get("size"), data.get("relation"),
                   data.get("target", ""), data.get("by_kernel", True),
                   tuple(data.get("accesses", ())))  # fmt: skip


def _part(mine: object, theirs: object, same: bool) -> str:
    if mine is None or theirs is None:
        return UNKNOWN
    return SAME if same else DIFFERS


def signature_fingerprint(signature: Signature | None) -> dict[str, Any] | None:
    """The fingerprint of the other classes: the signature itself."""
    if signature is None:
        return None
    return {
        "error_type": signature.error_type,
        "error_code": signature.error_code,
        "op": signature.op,
        "kind": signature.kind,
        "text": signature.describe(),
    }


def signature_parts(original: Signature, seen: Signature | None) -> tuple[tuple[str, str], ...]:
    """The error (its CUDA code, else its type) and the kind of two signatures, compared as
    `Signature.matches` compares them; the op is not here: a plain run cannot see it."""
    if seen is None:
        return (("error", UNKNOWN), ("kind", UNKNOWN))
    coded = original.error_code is not None or seen.error_code is not None
    error = (
        (original.error_code == seen.error_code)
        if coded
        else (original.error_type == seen.error_type)
    )
    return (("error", SAME if error else DIFFERS),
            ("kind", SAME if original.kind == seen.kind else DIFFERS))  # fmt: skip


@dataclass(frozen=True, slots=True)
class SameBug:
    """Is the repro the user's bug? `equal` None: it could not be checked (`skipped` says why).
    `parts`: each part of the fingerprint (kernel, access, size, address for a memory fault;
    error and kind for a signature) with SAME, DIFFERS or UNKNOWN, so that a "yes" says what
    agreed and what did not (the side of an address relation follows the allocation layout)."""

    kind: str  # "memcheck" (a memory fault's fingerprint) or "signature"
    original: dict[str, Any] | None
    repro: dict[str, Any] | None
    equal: bool | None
    skipped: tuple[str, ...] = ()
    differ: tuple[str, ...] = ()
    note: str = ""  # e.g. a walk-back to a candidate whose fingerprint matched
    parts: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "equal": self.equal,
            "verdict": self.verdict(),
            "parts": dict(self.parts),
            "original": self.original,
            "repro": self.repro,
            "differ": list(self.differ),
            "skipped": list(self.skipped),
            "note": self.note,
        }

    def verdict(self) -> str:
        """ "yes: same kernel and access; the address relation differs (expected when the
        allocation layout changes)", "no: the kernel differs; same access", "not checked"."""
        if self.equal is None:
            return "not checked"
        if not self.parts:
            return "yes" if self.equal else f"no ({', '.join(self.differ) or 'differs'})"
        parts, names = dict(self.parts), _PART_NAMES[self.kind]
        compared = [p for p in names if p != "size" or p in self.differ]  # size: misaligned only
        same = [names[p] for p in compared if parts.get(p) == SAME]
        differ = [names[p] for p in compared if parts.get(p) == DIFFERS]
        unknown = [names[p] for p in compared if parts.get(p) == UNKNOWN]
        agreed = f"same {_joined(same)}" if same else ""
        if not differ and not self.equal:  # no part differs, yet not every plain run failed
            return f"no ({', '.join(self.differ) or 'differs'})" + (f"; {agreed}" if same else "")
        if self.equal:  # what differs is what the comparison leaves to the allocation layout
            clauses = [
                agreed or "nothing compared",
                *(f"the {n} differs ({LAYOUT})" for n in differ),
            ]
        else:
            clauses = [*(f"the {name} differs" for name in differ), agreed]
        if parts.get("size") == DIFFERS and "size" not in compared:
            sizes = (_side(self.original, "size"), _side(self.repro, "size"))
            clauses.append(f"the access size differs ({sizes[0]} B, then {sizes[1]} B)")
        if unknown:
            clauses.append(f"{_joined(unknown)} not reported")
        return ("yes: " if self.equal else "no: ") + "; ".join(c for c in clauses if c)

    def markdown(self) -> str:
        """The section report.md gives it: the verdict, then both fingerprints part by part."""

        def text(side: dict[str, Any] | None) -> str:
            return "-" if side is None else str(side.get("text", side)).replace("|", "\\|")

        how = "compute-sanitizer memcheck" if self.kind == "memcheck" else "the failure signature"
        lines = [f"Same bug as the original ({how}): **{self.verdict()}**", ""]
        if self.parts and self.kind == "memcheck":
            lines += ["| part | original | repro.py | |", "|---|---|---|---|"]
            lines += [
                f"| {_PART_NAMES[self.kind][name]} | {_shown(self.original, name)} | "
                f"{_shown(self.repro, name)} | {state} |"
                for name, state in self.parts
            ]
        else:
            lines += ["| | fingerprint |", "|---|---|",
                      f"| original | {text(self.original)} |", f"| repro.py | {text(self.repro)} |"]  # fmt: skip
        if self.skipped or self.note:
            lines.append("")
        lines += [f"- skipped: {reason}" for reason in self.skipped]
        if self.note:
            lines.append(f"- {self.note}")
        return "\n".join(lines)


_PART_NAMES = {
    "memcheck": {"kernel": "kernel", "access": "access", "size": "access size",
                 "address": "address relation"},
    "signature": {"error": "error", "kind": "kind"},
}  # fmt: skip


def _joined(names: list[str]) -> str:
    """kernel, access and address relation."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _side(side: dict[str, Any] | None, field_name: str) -> Any:
    return None if side is None else side.get(field_name)


def _shown(side: dict[str, Any] | None, part: str) -> str:
    """One part of a memory fingerprint's JSON, as its table cell."""
    if side is None:
        return "-"
    if part == "address":
        relation = side.get("relation")
        text = f"{relation} {side.get('target') or ''}".strip() if relation else "-"
    elif part == "size":
        text = f"{side['size']} B" if side.get("size") else "-"
    else:
        text = str(side.get(part) or "-")
    return text.replace("|", "\\|")
