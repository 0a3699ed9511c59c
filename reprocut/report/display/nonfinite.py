"""What `record` shows of a NaN/inf origin: how it was made, the ops that carried it on, and
where the run ended; and the `nonfinite` object of `--json`."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from reprocut.model.case import SourceLocation
from reprocut.model.nonfinite import ENTERED, FROM_INF, Link, NonfiniteOrigin
from reprocut.report.paths import where_text


def kind_name(kind: str) -> str:
    return "NaN" if kind == "nan" else "inf"


def how_text(origin: NonfiniteOrigin) -> str:
    """ "made inf from finite inputs" and its two fallbacks, in words."""
    if origin.how == FROM_INF:
        return "made NaN from inputs holding only inf (no NaN went in)"
    if origin.how == ENTERED:
        held = f" ({origin.entered_as})" if origin.entered_as else ""
        return (
            f"first read a {kind_name(origin.kind)} here: it was already in an input{held} "
            f"when step {origin.step} began, so no op of that step made it"
        )
    return f"made {kind_name(origin.kind)} from finite inputs"


def _chain_groups(chain: tuple[Link, ...]) -> list[tuple[Link, list[Link]]]:
    """Consecutive links of one line and phase, together."""
    groups: list[tuple[Link, list[Link]]] = []
    for link in chain:
        if groups and (groups[-1][0].source, groups[-1][0].phase) == (link.source, link.phase):
            groups[-1][1].append(link)
        else:
            groups.append((link, [link]))
    return groups


def nonfinite_section(origin: NonfiniteOrigin, cwd: str = "", *, full: bool) -> RenderableType:
    """The panel's NaN/inf part. `full`: the origin is not the panel's own op (it was traced
    from a later failure), so its op, step, line and facts are shown here too."""
    parts: list[RenderableType] = [Text("\nwhere the NaN/inf came from", style="bold")]
    head = Text()
    if full:
        head.append("  op       ", style="bold")
        head.append(origin.op, style="bold cyan")
        head.append(f"   step {origin.step} ({origin.phase})\n")
        if origin.module:
            head.append(f"  module   {origin.module}\n")
        if origin.source is not None:
            head.append(f"  line     {where_text(origin.source, cwd)}  ")
            head.append(f"{origin.source.text}\n", style="dim")
    head.append(f"  {how_text(origin)}", style="yellow")
    if origin.autograd_node:
        head.append(f"\n  in the backward of {origin.autograd_node}")
        if origin.source is not None:
            head.append(f", whose forward line is {where_text(origin.source, cwd)}", style="dim")
    parts.append(head)
    if full and origin.facts:
        parts.append(Text("\n".join(f"  {fact}" for fact in origin.facts), style="yellow"))
    if origin.chain:
        parts.append(Text("then carried on by", style="bold"))
        lines = []
        for first, links in _chain_groups(origin.chain):
            line = Text(f"  {where_text(first.source, cwd)} ({first.phase}")
            if first.autograd_node:
                line.append(f", {first.autograd_node}")
            line.append("): ")
            line.append(" → ".join(link.describe() for link in links), style="cyan")
            lines.append(line)
        parts.append(Text("\n").join(lines))
    if origin.ended is not None:
        ended = origin.ended
        line = Text("where the run ended: ", style="bold")
        if ended.how == "failed":
            line.append(f"failed at step {ended.step}: ", style="red")
            line.append(ended.message)
            where = [
                w for w in (ended.op, where_text(ended.source, cwd) if ended.source else "") if w
            ]
            if where:
                line.append(f" ({', '.join(where)})", style="dim")
        else:
            line.append(ended.message)
        parts.append(line)
    return Group(*parts)


def nonfinite_json(origin: NonfiniteOrigin) -> dict[str, Any]:
    def location(loc: SourceLocation | None) -> dict[str, Any] | None:
        return None if loc is None else {"file": loc.file, "line": loc.line, "text": loc.text}

    return {
        "op": origin.op,
        "how": origin.how,
        "kind": origin.kind,
        "step": origin.step,
        "phase": origin.phase,
        "module": origin.module,
        "source": location(origin.source),
        "autograd_node": origin.autograd_node,
        "public_call": origin.public_call,
        "facts": list(origin.facts),
        "entered_as": origin.entered_as,
        "chain": [
            {
                "op": link.op,
                "kind": link.kind,
                "step": link.step,
                "phase": link.phase,
                "module": link.module,
                "source": location(link.source),
                "autograd_node": link.autograd_node,
            }
            for link in origin.chain
        ],
        "ended": None
        if origin.ended is None
        else {
            "how": origin.ended.how,
            "message": origin.ended.message,
            "step": origin.ended.step,
            "op": origin.ended.op,
            "source": location(origin.ended.source),
        },
    }
