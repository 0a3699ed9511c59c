"""The README and the docs pages read as data: their fenced blocks, the reprocut commands in
them, the links. Shared by tests/test_docs.py; nothing here runs a command."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(`{3,})(\w*)\n(.*?)^\1$", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"(?<!`)`(reprocut [^`]+)`(?!`)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
SKIP_MARK = re.compile(r"^# (needs a GPU|slow)\b")
EXPECTED_EXIT = re.compile(r"#.*\bexits (\d+)\b")
PIP_PREFIX = re.compile(r"^pip install [^&]*&&\s*")


def pages() -> list[Path]:
    """The README and the site's pages (docs/assets/ holds data: the report.md files quoted)."""
    docs = REPO / "docs"
    return [REPO / "README.md", *sorted(p for p in docs.rglob("*.md") if "assets" not in p.parts)]


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced block of a page: its language and its text."""

    page: Path
    language: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}: {self.text.splitlines()[0]}"

    @property
    def lines(self) -> list[str]:
        return [line for line in self.text.splitlines() if line.strip()]

    @property
    def skip_reason(self) -> str | None:
        """`needs a GPU` or `slow`, from `# needs a GPU` or `# slow: why` on the first line."""
        match = SKIP_MARK.match(self.lines[0]) if self.lines else None
        return match[1] if match else None

    def invokes_reprocut(self) -> bool:
        return any(command_words(line)[:1] == ["reprocut"] for line in self.lines)


def blocks(page: Path) -> Iterator[Block]:
    for match in FENCE.finditer(page.read_text()):
        yield Block(page, match[2], match[3])


def command_words(line: str) -> list[str]:
    """A shell line's words without its comment, a leading `$ ` or `pip install ... &&`."""
    line = PIP_PREFIX.sub("", line.strip().removeprefix("$ "))
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return []


def reprocut_commands(page: Path) -> Iterator[list[str]]:
    """The arguments of every `reprocut ...` the page writes: in fenced shell and text blocks,
    each `&&` part on its own, and in inline code. A synopsis (`reprocut shrink [RUN_DIR]
    [OPTIONS]`) is left out: its placeholders are not arguments."""
    for block in blocks(page):
        if block.language not in ("bash", "text", ""):
            continue
        for line in block.lines:
            for part in line.split("&&"):
                words = command_words(part)
                if words[:1] == ["reprocut"] and not is_synopsis(words):
                    yield words[1:]
    for match in INLINE.finditer(page.read_text()):
        words = command_words(match[1])
        if not is_synopsis(words):
            yield words[1:]


def is_synopsis(words: list[str]) -> bool:
    return any(word.startswith(("[", "(")) for word in words)


def runnable(block: Block) -> list[tuple[str, int]]:
    """The block's shell lines as the docs test runs them, each with the exit code it expects
    (`# exits N` on the line, else 0); a leading `pip install ... &&` is dropped: the test runs
    in the installed environment."""
    commands = []
    for line in block.lines:
        if line.startswith("#"):
            continue
        expected = EXPECTED_EXIT.search(line)
        command = PIP_PREFIX.sub("", line.split(" #")[0].strip())
        commands.append((command, int(expected[1]) if expected else 0))
    return commands


def relative_links(page: Path) -> Iterator[str]:
    text = FENCE.sub("", page.read_text())
    for match in LINK.finditer(text):
        target = match[1]
        if ":" not in target and not target.startswith("#"):
            yield target


def documented_recording_files() -> set[str]:
    """The file and folder names the recording-folder page documents, as fnmatch patterns
    (`<attempt>.config.json` -> `*.config.json`; `ranks/<rank>/` -> `ranks`)."""
    text = (REPO / "docs" / "reference" / "recordings.md").read_text()
    patterns = set()
    for row in re.findall(r"^\| (`.+?) \|", text, re.MULTILINE):
        for name in re.findall(r"`([^`]+)`", row):
            first = name.strip("/").split("/")[0]
            patterns.add(re.sub(r"<[^>]+>", "*", first))
    return patterns
