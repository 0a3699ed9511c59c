"""Memory per step as a self-contained SVG (opens in any browser; no plotting dependency):
allocated, reserved, and the part of allocated carried over from earlier steps, with the
failing step marked."""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

from reprocut.model.memory import MemoryReport
from reprocut.model.oom import format_bytes

PLOT_FILE = "memory.svg"
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 720, 360, 90, 20, 40, 50
_SERIES = (("reserved", "#9ecae1"), ("allocated", "#3182bd"), ("carried", "#e6550d"))


def render_svg(report: MemoryReport) -> str:
    steps = report.steps
    last = max((s.step for s in steps), default=0)
    if report.failing_step is not None:
        last = max(last, report.failing_step)
    top = max([s.reserved for s in steps] + [1])
    if report.requested_bytes and report.requested_bytes < 4 * top:
        top = max(top, (report.reserved_bytes or 0) + report.requested_bytes)
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(step: float) -> float:
        return _LEFT + (step / last if last else 0.5) * width

    def y(value: float) -> float:
        return _TOP + height - value / top * height

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{_LEFT}" y="20" font-size="14">memory at the end of each step</text>',
    ]
    for i in range(5):
        value = top * i / 4
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            'stroke="#ddd"/>'
            f'<text x="{_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{escape(format_bytes(value))}</text>"
        )
    for step in sorted({0, last, *(s.step for s in steps[:: max(1, len(steps) // 8)])}):
        parts.append(
            f'<text x="{x(step):.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle">{step}</text>'
        )
    parts.append(f'<text x="{_LEFT + width / 2}" y="{_H - 12}" text-anchor="middle">step</text>')
    for name, color in _SERIES:
        points = " ".join(f"{x(s.step):.1f},{y(getattr(s, name)):.1f}" for s in steps)
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}">'
            f"<title>{name}</title></polyline>"
        )
    for i, (name, color) in enumerate(_SERIES):
        label = "kept from earlier steps" if name == "carried" else name
        parts.append(
            f'<rect x="{_LEFT + 10 + i * 190}" y="{_TOP + 4}" width="12" height="12" '
            f'fill="{color}"/><text x="{_LEFT + 28 + i * 190}" y="{_TOP + 14}">{label}</text>'
        )
    if report.failing_step is not None:
        fx = x(report.failing_step)
        request = report.requested_bytes
        what = f"out of memory: {format_bytes(request)} asked" if request else "out of memory"
        parts.append(
            f'<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{_TOP}" y2="{_TOP + height}" '
            'stroke="#d62728" stroke-dasharray="4 3" stroke-width="2"/>'
            f'<text x="{fx - 4:.1f}" y="{_TOP + 32}" text-anchor="end" fill="#d62728">'
            f"step {report.failing_step}: {escape(what)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_plot(report: MemoryReport, path: Path) -> str:
    """Write the SVG; returns its file name (relative to the run folder)."""
    path.write_text(render_svg(report))
    return path.name
