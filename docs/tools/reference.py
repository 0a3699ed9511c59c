"""The command reference and the exit codes as markdown, read from reprocut itself.

The options come from each command's own `add_arguments` (the parser `reprocut CMD --help`
prints), the exit codes from the ExitCode enum and the meanings `reprocut --help` gives them, so
the pages say what the installed reprocut does. Written into the pages by sync.py.
"""

from __future__ import annotations

import argparse
import importlib
import re

from reprocut import cli
from reprocut.model.errors import ExitCode

EPILOG_CODE = re.compile(r"^ {2}(\d+) {2}(.+)$")


def command_parser(name: str) -> argparse.ArgumentParser:
    """`reprocut NAME`'s parser, built as cli.build_parser builds it."""
    module = importlib.import_module(cli.COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"reprocut {name}", description=module.__doc__)
    module.add_arguments(parser)
    return parser


MARKDOWN_SPECIAL = re.compile(r"([\\*_<>|\[\]])")


def markdown_cell(text: str) -> str:
    """Help text as one markdown table cell: what markdown would read as emphasis or HTML
    (`__main__`, `<id>`) escaped, code spans left as they are."""
    parts = " ".join(text.split()).split("`")
    escaped = (
        part if i % 2 else MARKDOWN_SPECIAL.sub(r"\\\1", part) for i, part in enumerate(parts)
    )
    return "`".join(escaped)


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest.upper()}`"
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{flags}`"
    return f"`{flags} {action.metavar or action.dest.upper()}`"


def _synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    if parser.usage:
        return "\n".join(line.strip() for line in parser.usage.splitlines())
    positionals = [a for a in parser._actions if not a.option_strings]
    words = [f"reprocut {name}", "[OPTIONS]"]
    words += [f"[{a.dest.upper()}]" if a.nargs == "?" else a.dest.upper() for a in positionals]
    return " ".join(words)


def command_markdown(name: str) -> str:
    parser = command_parser(name)
    rows = [
        f"| {_invocation(action)} | {markdown_cell(action.help or '')} |"
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
    ]
    return "\n".join(
        [
            f"## `reprocut {name}`",
            "",
            "```text",
            _synopsis(name, parser),
            "",
            (parser.description or "").strip(),
            "```",
            "",
            "| option | what it does |",
            "|---|---|",
            *rows,
            "",
        ]
    )


def cli_markdown() -> str:
    commands = "\n".join(
        f"| `reprocut {name}` | {help_text} |" for name, (_, help_text) in cli.COMMANDS.items()
    )
    parts = [
        "| command | what it does |",
        "|---|---|",
        commands,
        "",
        *(command_markdown(name) for name in cli.COMMANDS),
    ]
    return "\n".join(parts)


def exit_code_meanings() -> dict[int, str]:
    """What `reprocut --help` says each exit code means; every ExitCode must have a line."""
    meanings = {}
    for line in cli.EPILOG.splitlines():
        match = EPILOG_CODE.match(line)
        if match:
            meanings[int(match[1])] = match[2].strip()
    missing = {int(code) for code in ExitCode} ^ set(meanings)
    if missing:
        raise ValueError(f"exit codes in ExitCode and `reprocut --help` differ: {sorted(missing)}")
    return meanings


def exit_codes_markdown() -> str:
    meanings = exit_code_meanings()
    rows = [
        f"| {int(code)} | `{code.name}` | {markdown_cell(meanings[code])} |" for code in ExitCode
    ]
    return "\n".join(["| code | name | meaning |", "|---|---|---|", *rows, ""])
