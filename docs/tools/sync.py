"""Fill the generated regions of the README and the docs pages, or check that they are current.

A region is written by a tool, never by hand, so the docs cannot drift from what they quote:

    <!-- begin quote ../assets/embedding/repro.py from import -->
    ```python
    ...the file's lines, from the first that starts with "import"...
    ```
    <!-- end -->

Kinds: `quote PATH` (a file, PATH relative to the page; `from TEXT` starts at the first line that
starts with TEXT; `json KEY` quotes that key of a JSON file, `a.b` for a nested one, and
`json KEY omit X,Y` leaves the keys X and Y out), `cli` (the options of every command,
from reprocut's own argument parsers) and `exit-codes` (from the ExitCode enum and `--help`).

    python docs/tools/sync.py            # rewrite the regions
    python docs/tools/sync.py --check    # exit 1 and name each stale region
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import reference

REPO = Path(__file__).resolve().parents[2]
REGION = re.compile(r"(<!-- begin (?P<spec>.+?) -->\n)(?P<body>.*?)(<!-- end -->)", re.DOTALL)
FENCES = {".py": "python", ".json": "json", ".md": "markdown", ".toml": "toml"}


def pages() -> Iterator[Path]:
    yield REPO / "README.md"
    yield from sorted(p for p in (REPO / "docs").rglob("*.md") if "assets" not in p.parts)


def json_part(data: object, argument: str) -> object:
    """`a.b` of a JSON document; `a.b omit x,y` without the keys x and y (in a list: in each
    of its objects)."""
    path, _, omitted = argument.partition(" omit ")
    for key in path.split("."):
        data = data[key]
    drop = set(omitted.split(",")) if omitted else set()

    def without(item: object) -> object:
        return {k: v for k, v in item.items() if k not in drop} if isinstance(item, dict) else item

    return [without(item) for item in data] if isinstance(data, list) else without(data)


def quote(page: Path, spec: str) -> str:
    """A fenced block holding the file (or the part) that `spec` names."""
    path_text, _, rest = spec.partition(" ")
    path = (page.parent / path_text).resolve()
    text = path.read_text()
    mode, _, argument = rest.partition(" ")
    if mode == "from":
        lines = text.splitlines(keepends=True)
        start = next(i for i, line in enumerate(lines) if line.startswith(argument))
        text = "".join(lines[start:])
    elif mode == "json":
        text = json.dumps(json_part(json.loads(text), argument), indent=2, ensure_ascii=False)
    elif mode:
        raise ValueError(f"{page}: unknown quote mode {mode!r} in {spec!r}")
    language = "json" if mode == "json" else FENCES.get(path.suffix, "text")
    fence = "````" if "```" in text else "```"
    return f"{fence}{language}\n{text.rstrip()}\n{fence}\n"


def generate(page: Path, spec: str) -> str:
    kind, _, argument = spec.partition(" ")
    if kind == "quote":
        return quote(page, argument)
    if kind == "cli":
        return reference.cli_markdown()
    if kind == "exit-codes":
        return reference.exit_codes_markdown()
    raise ValueError(f"{page}: unknown region {spec!r}")


def synced(page: Path) -> str:
    text = page.read_text()
    return REGION.sub(
        lambda m: m[1] + generate(page, m["spec"]) + m[4],
        text,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which pages are stale")
    options = parser.parse_args(argv)
    stale = []
    for page in pages():
        current, wanted = page.read_text(), synced(page)
        if current == wanted:
            continue
        stale.append(page.relative_to(REPO))
        if not options.check:
            page.write_text(wanted)
    for path in stale:
        print(f"{'stale' if options.check else 'updated'}: {path}")
    if options.check and stale:
        print("run `python docs/tools/sync.py` to regenerate them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
