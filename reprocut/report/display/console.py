"""Consoles and the error/internal-error messages every command shares."""

from __future__ import annotations

import sys
import traceback

from rich.console import Console

from reprocut.model.errors import ReprocutError


def make_console(*, stderr: bool = True, color: bool | None = None) -> Console:
    """A console for diagnostics (stderr by default); plain text when not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        file=stream,
        no_color=color is False,
        force_terminal=color is True or None,
        highlight=False,
        width=None if stream.isatty() else 100,
    )


def print_line(console: Console, text: str) -> None:
    """One line of progress or summary: word-wrapped on a terminal; off a terminal never
    wrapped at all (a log, a CI page or a pipe wraps, or not, as it likes)."""
    console.print(text, soft_wrap=not console.is_terminal)


def print_error(console: Console, exc: ReprocutError) -> None:
    console.print(f"[bold red]error[/] ({exc.slug}): {exc}", soft_wrap=True)
    if exc.hint:
        console.print(f"[bold]hint[/]: {exc.hint}", soft_wrap=True)


def print_internal_error(console: Console) -> None:
    console.print("[bold red]internal error[/]: reprocut itself failed. Traceback:")
    console.print(traceback.format_exc(), markup=False)
    console.print("Please report this with the traceback above (and the run directory if any).")
