"""The HTML report of a sweep: the models, the heatmap of operators by model, the findings."""

from __future__ import annotations

import math
from collections import defaultdict

from cl_audit.enums import SpeedVerdict, Status, Verdict
from cl_audit.render.html_model import _sites_table
from cl_audit.render.html_page import breakable, esc, html_page, summary_cards
from cl_audit.render.html_sweep_compiled import compiled_cell, compiled_scatter, has_compiled
from cl_audit.render.wording import (
    format_bytes,
    operator_examples,
)
from cl_audit.report import (
    ModelRow,
    SweepReport,
)

__all__ = ["sweep_html"]


def _model_row(row: ModelRow) -> str:
    s = row.summary
    converted = s.bytes_converted if s else 0
    extra = row.cost.extra_bytes if row.cost else 0
    share = row.cost.share if row.cost else 0.0
    return (
        f'<tr id="row-{esc(row.key)}" data-status="{esc(row.status.value)}"><td>'
        f'<a href="#model-{esc(row.key)}" '
        f'data-jump="model-{esc(row.key)}">{breakable(row.name, "/._:")}</a></td>'
        f"<td>{esc(row.source.value)}</td>"
        f"<td>{esc(row.status.value)}</td><td>{esc(row.mode.value)}</td>"
        f"<td>{esc(row.verdict.value if row.verdict else '')}</td>"
        f'<td class="num" data-value="{extra}">{format_bytes(extra)}</td>'
        f'<td class="num" data-value="{share}">{share:.2%}</td>'
        f'<td class="num">{len(row.offenders)}</td>'
        f'<td class="num">{s.losses if s else 0}</td>'
        f'<td class="num" data-value="{converted}">{format_bytes(converted)}</td>'
        f'<td class="num">{s.parameter_conversions if s else 0}</td>'
        f'<td class="num">{s.format_neutral if s else 0}</td>'
        f"{_speed_cell(row)}<td>{esc(row.message or '')}</td></tr>"
    )


def _speed_cell(row: ModelRow) -> str:
    """The eager speedup and verdict (sorted by), the compiled ones under them."""
    speed = row.speed
    if speed is None or speed.speedup is None:
        text = esc(speed.verdict.value if speed else "")
        return f'<td class="num" data-value="0">{text}{compiled_cell(row)}</td>'
    return (
        f'<td class="num" data-value="{speed.speedup:.4f}" title="{esc(speed.verdict.value)}">'
        f"{speed.speedup:.2f}x {esc(speed.verdict.value)}{compiled_cell(row)}</td>"
    )


_SCATTER_W, _SCATTER_H, _MARGIN = 640, 360, 48
_COLOURS = {"offending": "#d62d20", "minor": "#e0a030", "clean": "#3b82c4"}


def _share_label(share: float) -> str:
    """``10%``, ``1%``, ``0.1%``, ``0.001%``: a decade of the byte share."""
    return f"{share * 100:g}%"


def _x_ticks(lo: float, hi: float) -> list[float]:
    """Decades of the byte share between ``10**lo`` and ``10**hi``."""
    return [10.0**k for k in range(math.ceil(lo), math.floor(hi) + 1)]


_Y_TICKS = (0.25, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)


def _scatter(report: SweepReport) -> str:
    """Each model that has both verdicts as a point, linked to its row and named on hover: the
    share of its bytes that only channels_last writes (across, log scale, decades ticked)
    against its speedup (up, log scale, ticked: above the dashed line channels_last is faster),
    coloured by the byte verdict. When no model copies more in channels_last (every share
    zero) the points stand side by side in the order of their speedup instead."""
    points = [r for r in report.models
              if r.cost is not None and r.speed is not None and r.speed.speedup]  # fmt: skip
    if not points:
        return '<p class="dim">No model has both a byte verdict and a speed verdict.</p>'
    floor = 1e-5
    shares = [max(r.cost.share, floor) for r in points]  # type: ignore[union-attr]
    speeds = [r.speed.speedup for r in points]  # type: ignore[union-attr]
    spread = all(r.cost.share == 0 for r in points)  # type: ignore[union-attr]
    lo_x, hi_x = math.log10(min(shares)), math.log10(max(max(shares), 0.5))
    lo_y = math.log2(min(min(speeds), 0.8))
    hi_y = math.log2(max(max(speeds), 1.25))
    width, height = _SCATTER_W - 2 * _MARGIN, _SCATTER_H - 2 * _MARGIN
    order = sorted(range(len(points)), key=lambda i: speeds[i]) if spread else []
    rank = {i: n for n, i in enumerate(order)}

    def across(share: float) -> float:
        return _MARGIN + width * (math.log10(share) - lo_x) / max(hi_x - lo_x, 1e-9)

    def x(i: int) -> float:
        return _MARGIN + width * (rank[i] + 0.5) / len(points) if spread else across(shares[i])

    def y(speedup: float) -> float:
        return _MARGIN + height * (1 - (math.log2(speedup) - lo_y) / max(hi_y - lo_y, 1e-9))

    dots = "".join(
        f'<a href="#row-{esc(r.key)}" data-jump="row-{esc(r.key)}"><circle class="point" '
        f'cx="{x(i):.1f}" cy="{y(speeds[i]):.1f}" r="4" '
        f'fill="{_COLOURS.get(r.verdict.value if r.verdict else "", "#888")}" '
        f'data-model="{esc(r.key)}"><title>{esc(r.name)}: {r.cost.share:.2%} of the bytes, '  # type: ignore[union-attr]
        f"{speeds[i]:.2f}x ({esc(r.speed.verdict.value)})</title></circle></a>"  # type: ignore[union-attr]
        for i, r in enumerate(points)
    )
    bottom, right = _SCATTER_H - _MARGIN, _SCATTER_W - _MARGIN
    ticks = "".join(
        f'<line x1="{_MARGIN - 4}" x2="{_MARGIN}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#666"/>'
        f'<text class="tick" x="{_MARGIN - 6}" y="{y(t) + 4:.1f}" text-anchor="end" '
        f'font-size="11">{t:g}x</text>'
        for t in _Y_TICKS
        if lo_y <= math.log2(t) <= hi_y
    )
    if spread:
        axis = "models, in the order of their speedup (no model copies more in channels_last)"
    else:
        axis = "share of the bytes only channels_last writes (log)"
        ticks += "".join(
            f'<line x1="{across(t):.1f}" x2="{across(t):.1f}" y1="{bottom}" y2="{bottom + 4}" '
            f'stroke="#666"/><text class="tick" x="{across(t):.1f}" y="{bottom + 16}" '
            f'text-anchor="middle" font-size="11">{"≤" if t <= floor else ""}'
            f"{_share_label(t)}</text>"
            for t in _x_ticks(lo_x, hi_x)
        )
    even = y(1.0)
    return (
        f'<svg id="speed-scatter" width="{_SCATTER_W}" height="{_SCATTER_H}" role="img" '
        'aria-label="byte share against speedup">'
        f'<line x1="{_MARGIN}" x2="{_MARGIN}" y1="{_MARGIN}" y2="{bottom}" stroke="#666"/>'
        f'<line x1="{_MARGIN}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#666"/>'
        f'<line x1="{_MARGIN}" x2="{right}" y1="{even:.1f}" y2="{even:.1f}" '
        f'stroke="#999" stroke-dasharray="4 3"/>{ticks}'
        f'<text x="{_MARGIN}" y="{_SCATTER_H - 8}" font-size="12">{esc(axis)}</text>'
        f'<text x="8" y="{_MARGIN - 14}" font-size="12">speedup: NCHW time / channels_last '
        f"time (log; dashed: even)</text>{dots}</svg>"
    )


def _heatmap(report: SweepReport) -> str:
    """Offending models by operator: the channels_last-only bytes of each model's cost sites at
    each op where the sweep weighed a cost, else its offender events (reports before costs)."""
    offending = [row for row in report.models if row.verdict is Verdict.OFFENDING]
    values: dict[str, dict[str, int]] = {row.key: defaultdict(int) for row in offending}
    for row in offending:
        for site in row.cost.sites if row.cost is not None else ():
            values[row.key][site.aten_op or site.op] += site.extra
        for finding in row.offenders if row.cost is None else ():
            values[row.key][finding.op_id] += finding.count
    ops = [cov.op for cov in report.operators if any(v.get(cov.op) for v in values.values())]
    if not ops:
        return '<p class="dim">No model offends at a located operation.</p>'
    peak = max(n for per_op in values.values() for n in per_op.values())
    weighed = any(row.cost is not None for row in offending)
    head = "".join(f'<th class="rot" title="{esc(op)}">{esc(op)}</th>' for op in ops)
    rows = []
    for row in offending:
        cells = []
        for op in ops:
            n = values[row.key].get(op, 0)
            style = f' style="background:rgba(214,45,32,{0.15 + 0.85 * n / peak:.2f})"' if n else ""
            shown = (format_bytes(n) if weighed else str(n)) if n else ""
            cells.append(
                f'<td class="cell"{style} title="{esc(row.name)} / {esc(op)}: {esc(shown)}" '
                f'data-jump="model-{esc(row.key)}">{esc(shown)}</td>'
            )
        rows.append(
            f'<tr><th data-jump="model-{esc(row.key)}">{esc(row.name)}</th>{"".join(cells)}</tr>'
        )
    return (
        f'<div class="wide"><table class="heat" id="heatmap"><thead><tr><th>model</th>{head}'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _findings_by_model(report: SweepReport) -> str:
    parts = []
    for row in report.models:
        if row.verdict is not Verdict.OFFENDING:
            continue
        table = _sites_table(row.offenders, f"sites-{row.key}", {})
        parts.append(
            f'<details id="model-{esc(row.key)}"><summary><b>{esc(row.name)}</b> '
            f"({esc(row.source.value)}, {len(row.offenders)} offender findings)</summary>"
            f"{table}</details>"
        )
    return "".join(parts)


def sweep_html(report: SweepReport) -> str:
    """A sweep: status counts, the models (sortable, filterable), the operator index, and the
    models by operators matrix of the offending models, each linked to its findings."""
    s, env = report.summary, report.environment
    cards = summary_cards(
        (
            ("models", s.models),
            ("offending", s.offending),
            ("minor", s.minor),
            ("clean", s.clean),
            ("failed", s.failed),
            ("skipped", s.skipped),
        )
    )
    speeds = [r.speed.verdict for r in report.models if r.speed is not None]
    speed_cards = summary_cards(
        tuple((f"speed {v.value}", speeds.count(v)) for v in SpeedVerdict if speeds.count(v))
    )
    compiled = has_compiled(report)
    statuses = "".join(f'<option value="{st.value}">{st.value}</option>' for st in Status)
    examples = operator_examples(report)
    operators = "".join(
        f'<tr><td><code class="aten">{breakable(c.op, "._")}</code></td>'
        f'<td class="num" data-value="{c.extra_bytes}">{format_bytes(c.extra_bytes)}</td>'
        f'<td class="num">{c.cost_models}</td><td>{breakable(", ".join(c.python_ops), "._")}</td>'
        f'<td class="num">{c.models}</td><td class="num">{c.events}</td>'
        f'<td class="num" data-value="{c.bytes_converted}">{format_bytes(c.bytes_converted)}</td>'
        f'<td class="num">{c.parameter_models}</td><td class="num">{c.neutral_models}</td>'
        f"<td>{esc(', '.join(examples.get(c.op, ())[:3]))}</td></tr>"
        for c in report.operators
    )
    body = (
        f"<h1>cl-audit sweep: {s.models} models</h1>"
        f'<p class="dim">{esc(env.device)} {esc(env.dtype)}, {esc(env.mode.value)} mode, engine '
        f"{esc(env.engine.value)}; cl-audit {esc(env.tool)}, torch {esc(env.torch)}</p>"
        f'<div class="cards">{cards}</div>'
        + (f'<div class="cards" id="speed-cards">{speed_cards}</div>' if speeds else "")
        + "<h2>Models</h2>"
        '<input type="search" id="filter" placeholder="filter models">'
        f'<select id="status-filter"><option value="">any status</option>{statuses}</select>'
        '<table class="sortable filterable" id="models"><thead><tr><th>model</th><th>source</th>'
        '<th>status</th><th>mode</th><th>verdict</th><th class="num">channels_last only</th>'
        '<th class="num">share</th><th class="num">offender sites</th>'
        '<th class="num">losses</th><th class="num">converted</th>'
        '<th class="num">parameter</th><th class="num">neutral</th><th class="num">speed</th>'
        + "<th>message</th></tr>"
        f"</thead><tbody>{''.join(_model_row(r) for r in report.models)}</tbody></table>"
        "<h2>Bytes against speed</h2>"
        + _scatter(report)
        + ("<h2>Eager against compiled speed</h2>" + compiled_scatter(report) if compiled else "")
        + "<h2>Operator coverage, by channels_last-only cost</h2>"
        '<table class="sortable" id="operators"><thead><tr><th>op</th><th class="num">'
        'channels_last only</th><th class="num">cost models</th><th>Python-level calls'
        '</th><th class="num">offender models</th><th class="num">events</th>'
        '<th class="num">converted'
        '</th><th class="num">parameter models</th><th class="num">neutral models</th>'
        f"<th>for example</th></tr></thead><tbody>{operators}</tbody></table>"
        "<h2>Offending models by operator</h2>"
        + _heatmap(report)
        + "<h2>Findings of each offending model</h2>"
        + _findings_by_model(report)
    )
    return html_page("cl-audit sweep", body, report.to_dict())
