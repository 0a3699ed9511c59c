"""A notebook cell's IPython syntax as Python, line for line.

A cell that compiles as Python runs as written. Otherwise its magics and shell lines become
calls of `_reprocut_magic(kind, name, text[, body])`, which the run provides
(record/inside/notebook.py): through IPython where it is installed, else skipped with a note.
Magics that only time or capture their code (`%%time`, `%timeit x = f()`, `%%capture`) run that
code itself, so it stays the user's code at its own lines. Every translation keeps the cell's
line count, so a frame's line is the line the user sees in the cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAGIC_CALL = "_reprocut_magic"
# magics whose body is the user's code: it runs as code, the magic itself is dropped
CODE_MAGICS = frozenset({"time", "timeit", "prun", "capture"})
_LINE = re.compile(
    r"^(?P<indent>\s*)(?:(?P<target>[A-Za-z_][\w.]*)\s*=\s*)?(?P<sigil>%|!)(?P<rest>.*)$"
)


@dataclass(frozen=True, slots=True)
class CellCode:
    """A cell as Python, and the IPython lines it held (for notes)."""

    code: str
    magics: tuple[str, ...] = ()


def _compiles(source: str) -> bool:
    try:
        compile(source, "<cell>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def translate_cell(source: str) -> CellCode:
    """The cell as Python with the same number of lines."""
    if _compiles(source):
        return CellCode(source)
    lines = source.split("\n")
    magics: list[str] = []
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        name, _, args = lines[first].strip()[2:].partition(" ")
        magics.append(lines[first].strip())
        if name in CODE_MAGICS:
            lines[first] = ""
        else:
            body = "\n".join(lines[first + 1 :])
            call = f"{MAGIC_CALL}({'cell'!r}, {name!r}, {args.strip()!r}, {body!r})"
            return CellCode(
                "\n".join([*lines[:first], call, *[""] * (len(lines) - first - 1)]),
                tuple(magics),
            )
    for index, line in enumerate(lines):
        translated = _translate_line(line)
        if translated is not None:
            magics.append(line.strip())
            lines[index] = translated
    return CellCode("\n".join(lines), tuple(magics))


def _translate_line(line: str) -> str | None:
    """A line magic or shell line as Python; None for a line of Python."""
    match = _LINE.match(line)
    if match is None or line.lstrip().startswith("%%"):
        return None
    indent, target, sigil, rest = match.group("indent", "target", "sigil", "rest")
    assign = f"{target} = " if target else ""
    if sigil == "!":
        kind = "getoutput" if target else "shell"
        return f"{indent}{assign}{MAGIC_CALL}({kind!r}, '', {rest.strip()!r})"
    name, _, args = rest.partition(" ")
    if name in CODE_MAGICS and args.strip() and name != "capture":
        return f"{indent}{assign}{_strip_options(args)}"
    return f"{indent}{assign}{MAGIC_CALL}('line', {name!r}, {args.strip()!r})"


def _strip_options(args: str) -> str:
    """`-n 10 -r 3 x = f()` -> `x = f()`: %timeit's options before the statement."""
    words = args.strip().split(" ")
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if option in ("-n", "-r", "-p", "-l", "-T", "-D", "-s") and words:
            words.pop(0)
    return " ".join(words)
