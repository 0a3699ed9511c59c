"""compute-sanitizer memcheck's report as data, and its addresses named by the repro's tensors.

memcheck prints each error as a block of `=========`-prefixed lines: a title ("Invalid __global__
read of size 4 bytes", "Program hit cudaErrorIllegalAddress (error 700) ..."), then indented
details: the kernel ("at kernel(args)+0x1f0", older releases "at 0x1f0 in kernel(args)"), the
thread and block, the address ("Access at 0x... is out of bounds"; older "Address 0x... is out
of bounds", "... is misaligned"), the nearest allocation, and the host backtrace ("Host Frame:"
lines, the module on the same line or the next). `parse_report` reads all of that; `describe`
names the address the way a person would: "reads 4 B at 3.5 GiB before the start of `x` (arg 0)".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reprocut.model.oom import format_bytes

PREFIX = "========="
_TITLE_ACCESS = re.compile(
    r"^Invalid (?P<space>__\w+__) (?P<kind>read|write|atomic)(?: of size (?P<size>\d+)(?: bytes?)?)?"
)
_TITLE_MISALIGNED = re.compile(r"^Misaligned (?:Shared or Local )?Address")
_TITLE_API = re.compile(
    r'^Program hit (?P<name>\w+) \(error (?P<code>\d+)\) due to "(?P<text>[^"]*)"'
    r"(?: on CUDA API call to (?P<call>\w+))?"
)
_AT_NEW = re.compile(r"^at (?P<kernel>.+?)\+0x[0-9a-fA-F]+(?: in (?P<where>\S+))?$")
_AT_OLD = re.compile(r"^at 0x[0-9a-fA-F]+ in (?P<kernel>.+)$")
_THREAD = re.compile(r"^by thread \((?P<thread>[\d,\s]+)\) in block \((?P<block>[\d,\s]+)\)")
_ADDRESS = re.compile(
    r"^(?:Access(?: at| to)?|Address) (?P<address>0x[0-9a-fA-F]+) is (?P<problem>out of bounds|misaligned"
    r"|not aligned.*|.+)$"
)
_NEAREST = re.compile(
    r"^and is (?P<distance>[\d,]+) bytes? (?P<side>before|after) the nearest allocation at "
    r"(?P<base>0x[0-9a-fA-F]+) of size (?P<size>[\d,]+) bytes?"
)
_HOST_FRAME = re.compile(r"^Host Frame:\s*(?P<frame>.*)$")
_SUMMARY = re.compile(r"^ERROR SUMMARY: (?P<count>[\d,]+) errors?$")
_BORING_MODULES = ("libcuda.so", "libcudart", "python3", "libpython")
_BORING_SYMBOLS = ("cudaLaunchKernel", "cuLaunchKernel", "_Py", "Py", "cudaStreamSynchronize")


@dataclass(frozen=True, slots=True)
class MemcheckError:
    """One error memcheck reported."""

    title: str
    access: str | None = None  # "read", "write", "atomic"; None for API errors
    size: int | None = None  # bytes accessed
    space: str | None = None  # "__global__", "__shared__", "__local__"
    kernel: str | None = None
    where: str | None = None  # device source file:line, when the kernel has line info
    thread: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None
    address: int | None = None
    problem: str | None = None  # "out of bounds", "misaligned"
    nearest: tuple[str, int, int, int] | None = None  # side, distance, base, size (bytes)
    host_frames: tuple[str, ...] = ()
    api_error: tuple[str, int, str] | None = None  # name, code, text ("Program hit ...")

    @property
    def is_access(self) -> bool:
        return self.access is not None or self.problem is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "access": self.access,
            "size": self.size,
            "space": self.space,
            "kernel": self.kernel,
            "where": self.where,
            "thread": None if self.thread is None else list(self.thread),
            "block": None if self.block is None else list(self.block),
            "address": None if self.address is None else hex(self.address),
            "problem": self.problem,
            "nearest": None if self.nearest is None else list(self.nearest),
            "host_frames": list(self.host_frames),
            "api_error": None if self.api_error is None else list(self.api_error),
        }


@dataclass(frozen=True, slots=True)
class MemcheckReport:
    errors: tuple[MemcheckError, ...] = ()
    summary: int | None = None  # the ERROR SUMMARY count (errors beyond --print-limit included)

    @property
    def first_access(self) -> MemcheckError | None:
        return next((e for e in self.errors if e.is_access), None)


def _integers(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.replace(" ", "").split(",") if part)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _blocks(text: str) -> list[list[str]]:
    """memcheck's lines grouped by error: a title line, then its indented details."""
    blocks: list[list[str]] = []
    for raw in text.splitlines():
        if not raw.startswith(PREFIX):
            continue
        body = raw[len(PREFIX) :]
        if not body.strip():
            continue
        if body.startswith(" ") and not body.startswith("  "):  # "========= Title"
            blocks.append([body.strip()])
        elif blocks:
            blocks[-1].append(body.strip())
    return blocks


def _frame(lines: list[str], index: int) -> tuple[str, int]:
    """A host frame's text, joined with a module printed on the next line ("in libfoo.so")."""
    frame = _HOST_FRAME.match(lines[index])["frame"].strip()  # type: ignore[index]
    if index + 1 < len(lines) and lines[index + 1].startswith("in "):
        return f"{frame} {lines[index + 1]}", index + 2
    return frame, index + 1


def _error(block: list[str]) -> MemcheckError | None:
    title, details = block[0], block[1:]
    fields: dict[str, Any] = {"title": title}
    if match := _TITLE_ACCESS.match(title):
        fields.update(access=match["kind"], space=match["space"])
        fields["size"] = int(match["size"]) if match["size"] else None
    elif _TITLE_MISALIGNED.match(title):
        fields["problem"] = "misaligned"
    elif match := _TITLE_API.match(title):
        fields["api_error"] = (match["name"], int(match["code"]), match["text"])
    else:
        return None
    frames: list[str] = []
    i = 0
    while i < len(details):
        line = details[i]
        if line.startswith("Host Frame:"):
            frame, i = _frame(details, i)
            frames.append(frame)
            continue
        if (match := _AT_NEW.match(line) or _AT_OLD.match(line)) and "kernel" not in fields:
            fields["kernel"] = match["kernel"].strip()
            fields["where"] = match.groupdict().get("where")
        elif match := _THREAD.match(line):
            fields["thread"], fields["block"] = (
                _integers(match["thread"]),
                _integers(match["block"]),
            )
        elif match := _ADDRESS.match(line):
            fields["address"], fields["problem"] = int(match["address"], 16), match["problem"]
        elif match := _NEAREST.match(line):
            fields["nearest"] = (match["side"], _number(match["distance"]),
                                 int(match["base"], 16), _number(match["size"]))  # fmt: skip
        i += 1
    fields["host_frames"] = tuple(frames)
    if "address" not in fields and "nearest" in fields:
        fields["address"] = _address_from_nearest(*fields["nearest"])
    return MemcheckError(**fields)


def _address_from_nearest(side: str, distance: int, base: int, size: int) -> int:
    """The access's address from "is N bytes after the nearest allocation at B of size S": N
    counts from the allocation's last byte (N = 1 is the byte just past it), so B + S + N - 1;
    before it, B - N. On the H200 (CUDA 13) memcheck's report of a cuSPARSE kernel's read was
    parsed with this line but no address line."""
    return base + size + distance - 1 if side == "after" else base - distance


def parse_report(text: str) -> MemcheckReport:
    """Every error in memcheck's output (other lines, the program's own, are ignored)."""
    errors, summary = [], None
    for block in _blocks(text):
        if match := _SUMMARY.match(block[0]):
            summary = _number(match["count"])
            continue
        error = _error(block)
        if error is not None:
            errors.append(error)
    return MemcheckReport(tuple(errors), summary)


_OLD_FRAME = re.compile(
    r"^(?P<module>\S+) \((?P<symbol>.+) \+ 0x[0-9a-fA-F]+\) \[0x[0-9a-fA-F]+\]$"
)
_NEW_FRAME = re.compile(r"^(?P<symbol>.*?)\s*\[0x[0-9a-fA-F]+\](?: in (?P<module>\S+))?")


def frame_parts(frame: str) -> tuple[str, str]:
    """(symbol without its arguments, module) of a host frame, in either release's format."""
    match = _OLD_FRAME.match(frame) or _NEW_FRAME.match(frame)
    if match is None:
        return frame, ""
    symbol = match["symbol"].strip()
    if "(" in symbol and not symbol.startswith("("):
        symbol = symbol[: symbol.index("(")]
    return symbol, (match["module"] or "").rsplit("/", 1)[-1]


def useful_frames(frames: Sequence[str], limit: int = 6) -> list[str]:
    """The host frames worth reading, as `symbol` (or `[module]` where it has none): the driver,
    the CUDA runtime and the interpreter's own frames left out."""
    kept = []
    for frame in frames:
        symbol, module = frame_parts(frame)
        if module.startswith(_BORING_MODULES) or symbol.startswith(_BORING_SYMBOLS):
            continue
        kept.append(symbol or f"[{module}]")
    return kept[:limit]


# --- naming an address -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorRange:
    """Where one of the repro's tensors lives: its storage's bytes, and where its view starts."""

    name: str
    storage_start: int
    storage_bytes: int
    view_start: int
    shape: tuple[int, ...] = ()
    dtype: str = ""
    position: int | str | None = None  # its place in the failing call (index or keyword)

    @property
    def storage_end(self) -> int:
        return self.storage_start + self.storage_bytes

    def label(self) -> str:
        if self.position is None:
            return f"`{self.name}`"
        kind = "arg" if isinstance(self.position, int) else "keyword"
        return f"`{self.name}` ({kind} {self.position})"

    @classmethod
    def from_json(cls, data: dict[str, Any], positions: dict[str, int | str] | None = None) -> TensorRange:  # fmt: skip
        name = str(data["name"])
        return cls(
            name=name,
            storage_start=int(data["storage_ptr"]),
            storage_bytes=int(data["storage_bytes"]),
            view_start=int(data["data_ptr"]),
            shape=tuple(data.get("shape", ())),
            dtype=str(data.get("dtype", "")),
            position=(positions or {}).get(name),
        )


def human_bytes(count: int) -> str:
    """4 B, 1.5 KiB, 3.5 GiB: distances in memcheck's findings, one digit is enough."""
    return format_bytes(count, digits=1)


_VERBS = {"read": "reads", "write": "writes", "atomic": "atomically updates"}


def describe(error: MemcheckError, tensors: Sequence[TensorRange]) -> str:
    """What the access did, relative to the nearest of the repro's tensors."""
    verb = _VERBS.get(error.access or "", "accesses")
    size = f" {human_bytes(error.size)}" if error.size else ""
    if error.address is None:
        return f"{verb}{size} (no address reported)"
    address = error.address
    where = f"at {hex(address)}"
    if tensors:
        best = nearest_tensor(address, tensors)
        if best.storage_start <= address < best.storage_end:
            offset = address - best.storage_start
            where = f"{human_bytes(offset)} into the {human_bytes(best.storage_bytes)} storage of {best.label()}"
        elif address < best.storage_start:
            where = (
                f"at {human_bytes(best.storage_start - address)} before the start of {best.label()}"
            )
        else:
            where = f"at {human_bytes(address - best.storage_end)} after the end of {best.label()}"
    problem = "" if error.problem in (None, "out of bounds") else f" ({error.problem})"
    return f"{verb}{size} {where}{problem}"


def nearest_tensor(address: int, tensors: Sequence[TensorRange]) -> TensorRange:
    """The tensor whose storage holds `address`, else the one it falls closest to."""
    return min(tensors, key=lambda tensor: _distance(address, tensor))


def _distance(address: int, tensor: TensorRange) -> int:
    if address < tensor.storage_start:
        return tensor.storage_start - address
    if address >= tensor.storage_end:
        return address - tensor.storage_end + 1
    return 0
