"""report.md's torch.compile section: the verdict, its evidence and, for a failure only the
compiler shows, what a compiler bug report needs (versions, Inductor settings)."""

from __future__ import annotations

from reprocut.model.compiled import CompileVerdict


def compile_markdown(verdict: CompileVerdict) -> list[str]:
    """report.md's torch.compile section."""
    lines = ["## torch.compile", "", f"**{verdict.summary()}.**", ""]
    lines.append(f"- compiled: {', '.join(f'`{name}`' for name in verdict.used)}")
    compiled = verdict.compiled
    if compiled is not None:
        lines.append(f"- compiled run (as you ran it): `{compiled.describe()}`")
        if compiled.kernel:
            lines.append(f"- Inductor-generated kernel: `{compiled.kernel}`")
        if compiled.assertion:
            lines.append(f"- its assertion: `{compiled.assertion}`")
    lines.append(f"- eager run: {f'`{verdict.eager}`' if verdict.eager else 'passed'}")
    if verdict.fails_eagerly is False:
        lines.append(
            "- likely a compiler bug (or a custom op whose fake implementation disagrees with "
            "its real one): the repro passes with `TORCH_COMPILE_DISABLE=1`"
        )
        for name, version in sorted(verdict.versions.items()):
            lines.append(f"- {name}: {version}")
        settings = verdict.inductor_settings
        if settings:
            lines.append("- `torch._inductor.config` settings not at their defaults:")
            lines += [f"  - `{name} = {value}`" for name, value in sorted(settings.items())]
        else:
            lines.append("- `torch._inductor.config`: every setting at its default")
    return lines
