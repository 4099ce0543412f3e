"""The compiled step on a sweep's page (``--compile --time`` sweeps): each model's compiled
speedup in the models table's speed cell, and eager against compiled speedup plotted."""

from __future__ import annotations

import math

from cl_audit.render.html_page import esc
from cl_audit.report import ModelRow, SweepReport

__all__ = ["compiled_cell", "compiled_scatter", "has_compiled"]

_W, _H, _MARGIN = 640, 400, 52
_TICKS = (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
_COLOURS = {"faster": "#2e8b57", "slower": "#d62d20", "no difference": "#888",
            "inconclusive": "#e0a030"}  # fmt: skip


def has_compiled(report: SweepReport) -> bool:
    """Whether any row carries a compiled part (the column and the plot are shown)."""
    return any(r.speed is not None and r.speed.compiled is not None for r in report.models)


def compiled_cell(row: ModelRow) -> str:
    """A row's compiled speedup and verdict, under its eager one in the speed cell (a column
    of its own would widen the models table past a 1280-pixel window); empty without one."""
    compiled = None if row.speed is None else row.speed.compiled
    if compiled is None:
        return ""
    if compiled.speedup is None:
        return f'<br><span class="dim">compiled {esc(compiled.verdict.value)}</span>'
    return (
        f'<br><span class="compiled" data-value="{compiled.speedup:.4f}">compiled '
        f"{compiled.speedup:.2f}x {esc(compiled.verdict.value)}</span>"
    )


def compiled_scatter(report: SweepReport) -> str:
    """Each model with both speedups as a point, linked to its row and named on hover: its
    eager speedup across, its compiled speedup up (both log scale, ticked; dashed: even in
    each, and the diagonal where compiling changes nothing), coloured by the compiled verdict.
    Above the diagonal, compiling favours channels_last more than eager runs do."""
    points = []
    for r in report.models:
        speed = r.speed
        if speed is None or speed.compiled is None:
            continue
        if speed.speedup and speed.compiled.speedup:
            points.append((r, speed.speedup, speed.compiled.speedup))
    if not points:
        return '<p class="dim">No model has both an eager and a compiled speedup.</p>'
    values = [v for _, e, c in points for v in (e, c)]
    lo, hi = math.log2(min(min(values), 0.8)), math.log2(max(max(values), 1.25))
    size = min(_W, _H) - 2 * _MARGIN

    def at(value: float) -> float:
        return size * (math.log2(value) - lo) / max(hi - lo, 1e-9)

    def x(value: float) -> float:
        return _MARGIN + at(value)

    def y(value: float) -> float:
        return _MARGIN + size - at(value)

    dots = "".join(
        f'<a href="#row-{esc(r.key)}" data-jump="row-{esc(r.key)}"><circle class="point" '
        f'cx="{x(e):.1f}" cy="{y(c):.1f}" r="4" '
        f'fill="{_COLOURS.get(r.speed.compiled.verdict.value, "#888")}" '  # type: ignore[union-attr]
        f'data-model="{esc(r.key)}"><title>{esc(r.name)}: eager {e:.2f}x, compiled {c:.2f}x '
        f"({esc(r.speed.compiled.verdict.value)})</title></circle></a>"  # type: ignore[union-attr]
        for r, e, c in points
    )
    low, high = _MARGIN, _MARGIN + size
    shown = [t for t in _TICKS if lo <= math.log2(t) <= hi]
    ticks = "".join(
        f'<text class="tick" x="{_MARGIN - 6}" y="{y(t) + 4:.1f}" text-anchor="end" '
        f'font-size="11">{t:g}x</text><text class="tick" x="{x(t):.1f}" y="{high + 16}" '
        f'text-anchor="middle" font-size="11">{t:g}x</text>'
        for t in shown
    )
    even = (
        f'<line x1="{low}" x2="{high}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" stroke="#bbb" '
        f'stroke-dasharray="4 3"/><line x1="{x(1.0):.1f}" x2="{x(1.0):.1f}" y1="{low}" '
        f'y2="{high}" stroke="#bbb" stroke-dasharray="4 3"/>'
        f'<line x1="{low}" x2="{high}" y1="{high}" y2="{low}" stroke="#999" '
        f'stroke-dasharray="2 4"/>'
    )
    return (
        f'<svg id="compiled-scatter" width="{_W}" height="{_H}" role="img" '
        'aria-label="eager speedup against compiled speedup">'
        f'<line x1="{low}" x2="{low}" y1="{low}" y2="{high}" stroke="#666"/>'
        f'<line x1="{low}" x2="{high}" y1="{high}" y2="{high}" stroke="#666"/>{even}{ticks}'
        f'<text x="{low}" y="{_H - 8}" font-size="12">eager speedup: NCHW time / '
        "channels_last time (log)</text>"
        f'<text x="8" y="{_MARGIN - 16}" font-size="12">compiled speedup (log; dotted: the '
        f"same as eager)</text>{dots}</svg>"
    )
