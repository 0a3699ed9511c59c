"""The torch.compile verdict in the failure panel: does the failure need the compiler?"""

from __future__ import annotations

from rich.text import Text

from reprocut.model.compiled import CompileVerdict


def compile_section(verdict: CompileVerdict) -> Text:
    """The verdict, then its evidence: the compiled run, the Inductor kernel, the eager run."""
    text = Text("\ntorch.compile ", style="bold")
    style = "bold green" if verdict.fails_eagerly else "bold magenta"
    text.append(verdict.summary(), style=style if verdict.fails_eagerly is not None else "yellow")
    text.append(f"\n  compiled: {', '.join(verdict.used)}", style="dim")
    compiled = verdict.compiled
    if compiled is not None:
        text.append(f"\n  compiled run ({compiled.seconds:.1f} s): ")
        text.append(compiled.describe(), style="red" if compiled.failed else "green")
        if compiled.kernel:
            text.append("\n  Inductor kernel: ")
            text.append(compiled.kernel, style="cyan")
        if compiled.assertion:
            text.append("\n  its assertion: ")
            text.append(compiled.assertion, style="red")
    if verdict.eager:
        text.append(f"\n  eager run: {verdict.eager}")
    elif verdict.fails_eagerly is False:
        text.append("\n  eager run: passed")
    if verdict.fails_eagerly is False and verdict.inductor_settings:
        changed = ", ".join(f"{k}={v}" for k, v in verdict.inductor_settings.items())
        text.append(f"\n  Inductor settings not at their defaults: {changed}", style="dim")
    return text
