"""Memory per step as a self-contained SVG (opens in any browser; no plotting dependency):
allocated, reserved, and the part of allocated carried over from earlier steps; at the failing
step, the failed request drawn on top of what was allocated, against the device's capacity.

Read at a glance: the axis ticks are round numbers of one binary unit (0, 32, 64, 96, 128 GiB),
and a series is drawn only where it was measured, so no line drops to zero at the failing step
because nothing was measured there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from xml.sax.saxutils import escape

from reprocut.model.memory import MemoryReport, StepMemory
from reprocut.model.oom import format_bytes

PLOT_FILE = "memory.svg"
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 760, 380, 80, 30, 56, 50
_SERIES = (("reserved", "#9ecae1"), ("allocated", "#3182bd"), ("carried", "#e6550d"))
_LABELS = {"carried": "kept from earlier steps"}
_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
_MAX_TICKS = 5
_OFF_CHART = 1.5  # a request this much past everything else is drawn clipped, with its figure


def nice_ticks(top: float) -> tuple[list[float], str, int]:
    """Round tick values from 0 to at least `top`: (values in bytes, unit name, unit bytes).
    The step is a power of two (a quarter at the least) of the largest unit `top` reaches:
    0, 32, 64, ... GiB."""
    name, size = next(((n, s) for n, s in _UNITS if top >= s), _UNITS[-1])
    in_units = max(top / size, 1e-9)
    step = 1.0
    while math.ceil(in_units / step) > _MAX_TICKS:
        step *= 2
    while step > 0.25 and math.ceil(in_units / (step / 2)) <= _MAX_TICKS:
        step /= 2
    count = max(1, math.ceil(in_units / step - 1e-9))
    return [i * step * size for i in range(count + 1)], name, size


def _tick_label(value: float, unit: str, size: int) -> str:
    number = value / size
    return f"{number:g} {unit}" if number else "0"


def _step_ticks(first: int, last: int) -> list[int]:
    """Step numbers 1, 2, 5, 10, 20, 50, ... apart, at most about ten, and the last step."""
    span, step = max(1, last - first), 1
    while span / step > 10:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    ticks = list(range(first, last + 1, step))
    return ticks if ticks[-1] == last else [*ticks, last]


def _measured(steps: tuple[StepMemory, ...], name: str) -> list[tuple[int, int]]:
    return [(s.step, v) for s in steps if (v := getattr(s, name)) is not None]


def render_svg(report: MemoryReport) -> str:
    steps = report.steps
    first = min((s.step for s in steps), default=0)
    last = max((s.step for s in steps), default=0)
    if report.failing_step is not None:
        last = max(last, report.failing_step)
    held = report.allocated_bytes or 0
    request = report.requested_bytes or 0
    capacity = report.device_total_bytes or 0
    base = max([s.reserved for s in steps] + [capacity, held, 1])
    asked_top = held + request
    clipped = asked_top > _OFF_CHART * base
    ticks, unit, size = nice_ticks(base if clipped else max(base, asked_top))
    top = ticks[-1]
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(step: float) -> float:
        return _LEFT + ((step - first) / (last - first) if last > first else 0.5) * width

    def y(value: float) -> float:
        return _TOP + height - min(value, top) / top * height

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{_LEFT}" y="20" font-size="14">memory at the end of each step'
        + (" and at the failure" if report.failing_step is not None else "")
        + "</text>",
    ]
    for value in ticks:
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            'stroke="#ddd"/>'
            f'<text x="{_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{escape(_tick_label(value, unit, size))}</text>"
        )
    for step in _step_ticks(first, last):
        parts.append(
            f'<text x="{x(step):.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle">{step}</text>'
        )
    parts.append(f'<text x="{_LEFT + width / 2}" y="{_H - 12}" text-anchor="middle">step</text>')
    if capacity:
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(capacity):.1f}" y2="{y(capacity):.1f}" '
            'stroke="#333" stroke-dasharray="6 4"/>'
            f'<text x="{_W - _RIGHT}" y="{y(capacity) - 5:.1f}" text-anchor="end">'
            f"device: {escape(format_bytes(capacity))}</text>"
        )
    same = all(s.reserved == s.allocated for s in steps)
    shown = [(n, c) for n, c in _SERIES if not (n == "reserved" and same)]
    for name, color in shown:
        points = _measured(steps, name)
        if not points:
            continue
        line = " ".join(f"{x(step):.1f},{y(value):.1f}" for step, value in points)
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}">'
            f"<title>{name}</title></polyline>"
        )
        parts.extend(
            f'<circle cx="{x(step):.1f}" cy="{y(value):.1f}" r="2.5" fill="{color}"/>'
            for step, value in points
        )
    for i, (name, color) in enumerate(shown):
        parts.append(
            f'<rect x="{_LEFT + 10 + i * 190}" y="{_TOP - 22}" width="12" height="12" '
            f'fill="{color}"/><text x="{_LEFT + 28 + i * 190}" y="{_TOP - 12}">'
            f"{_LABELS.get(name, name)}</text>"
        )
    if report.failing_step is not None:
        parts.extend(_failure_marks(report, x(report.failing_step), y, clipped, held, request))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _failure_marks(
    report: MemoryReport,
    fx: float,
    y: Callable[[float], float],
    clipped: bool,
    held: int,
    request: int,
) -> list[str]:
    """The failing step: a dashed line, and the request as a bar on top of what was allocated
    (clipped at the chart's top, with its figure, when it dwarfs the device)."""
    parts = [
        f'<line x1="{fx:.1f}" x2="{fx:.1f}" y1="{_TOP}" y2="{_H - _BOTTOM}" '
        'stroke="#d62728" stroke-dasharray="4 3" stroke-width="1.5"/>'
    ]
    what = f"step {report.failing_step}: out of memory"
    if request:
        bottom, tip = y(held), y(held + request)
        parts.append(
            f'<rect x="{fx - 9:.1f}" y="{tip:.1f}" width="18" height="{max(bottom - tip, 1):.1f}" '
            'fill="#d62728" fill-opacity="0.35" stroke="#d62728">'
            f"<title>asked {escape(format_bytes(request))}</title></rect>"
        )
        what += f", {format_bytes(request)} asked" + (" (off the chart)" if clipped else "")
        if held:
            what += f" on top of {format_bytes(held)} allocated"
    parts.append(
        f'<text x="{fx - 12:.1f}" y="{_TOP + 14}" text-anchor="end" fill="#d62728">'
        f"{escape(what)}</text>"
    )
    return parts


def write_plot(report: MemoryReport, path: Path) -> str:
    """Write the SVG; returns its file name (relative to the run folder)."""
    path.write_text(render_svg(report))
    return path.name
