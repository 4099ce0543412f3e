"""The model page's picture: where in the model the time and the copies go. One row per stage
(``report.stages``): a bar pair (channels_last, NCHW) of its step time and a bar of its cost
sites' channels_last-only bytes, drawn as inline SVG (no script, no network), each bar's
numbers on hover and in the table beside it; the stage holding the most cost is marked."""

from __future__ import annotations

from cl_audit.enums import SpeedBasis
from cl_audit.render.html_page import breakable, esc
from cl_audit.render.wording import format_bytes
from cl_audit.report.speed_report import Speed, SpeedRow
from cl_audit.report.stages import StageTime

__all__ = ["costliest", "stages_section"]

_ROW, _LABEL, _BARS, _BYTES, _GAP = 26, 170, 300, 150, 14
_CL, _NCHW, _COST = "#3b82c4", "#e0a030", "#d62d20"
_POINTER = " \u25c0"  # beside the costliest stage's name


def costliest(stages: tuple[StageTime, ...]) -> StageTime | None:
    """The stage holding the most cost: the most channels_last-only bytes; without any, the
    most time channels_last loses against NCHW; None where it loses none anywhere."""
    if any(s.extra_bytes for s in stages):
        return max(stages, key=lambda s: s.extra_bytes)
    worst = max(stages, key=lambda s: s.channels_last_ms - s.nchw_ms, default=None)
    return worst if worst is not None and worst.channels_last_ms > worst.nchw_ms else None


def _short(name: str, most: int = 24) -> str:
    return name if len(name) <= most else "\u2026" + name[-(most - 1) :]


def _svg(stages: tuple[StageTime, ...], marked: StageTime | None) -> str:
    longest = max(max(s.channels_last_ms, s.nchw_ms) for s in stages) or 1.0
    most_bytes = max(s.extra_bytes for s in stages) or 1
    width = _LABEL + _BARS + _GAP + _BYTES + 10
    height = _ROW * len(stages) + 24
    x_bytes = _LABEL + _BARS + _GAP
    rows = []
    for i, s in enumerate(stages):
        y = 20 + i * _ROW
        mark = s is marked
        cl_w, nchw_w = (max(ms / longest * _BARS, 0.5) for ms in (s.channels_last_ms, s.nchw_ms))
        band = f'<rect x="0" y="{y - 2}" width="{width}" height="{_ROW - 2}" fill="#fdecea"/>'
        label = f"<title>{esc(s.name)}</title>{esc(_short(s.name))}{_POINTER if mark else ''}"
        rows.append(
            f'<g class="stage{" costliest" if mark else ""}" data-stage="{esc(s.name)}">'
            f"{band if mark else ''}"
            f'<text x="{_LABEL - 6}" y="{y + 14}" text-anchor="end">{label}</text>'
            f'<rect class="bar cl" x="{_LABEL}" y="{y}" width="{cl_w:.1f}" height="9" '
            f'fill="{_CL}"><title>{esc(s.name)}: channels_last {s.channels_last_ms:.3f} ms'
            f"</title></rect>"
            f'<rect class="bar nchw" x="{_LABEL}" y="{y + 10}" width="{nchw_w:.1f}" height="9" '
            f'fill="{_NCHW}"><title>{esc(s.name)}: NCHW {s.nchw_ms:.3f} ms</title></rect>'
            f'<rect class="bar bytes" x="{x_bytes}" y="{y + 3}" '
            f'width="{s.extra_bytes / most_bytes * _BYTES:.1f}" height="13" fill="{_COST}">'
            f"<title>{esc(s.name)}: {format_bytes(s.extra_bytes)} channels_last-only</title></rect>"
            f'<line x1="{x_bytes}" y1="{y}" x2="{x_bytes}" y2="{y + 19}" stroke="#bbb"/></g>'
        )
    head = (
        f'<text x="{_LABEL}" y="12" class="axis">step time, 0 to {longest:.2f} ms</text>'
        f'<text x="{_LABEL + _BARS + _GAP}" y="12" class="axis">channels_last-only bytes</text>'
    )
    return (
        f'<svg id="stages-picture" role="img" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" font-size="12" font-family="system-ui,sans-serif">'
        f"<title>Step time by stage in each layout, and each stage's channels_last-only bytes"
        f"</title>{head}{''.join(rows)}</svg>"
    )


def _ratio(s: StageTime) -> str:
    """As the time table's rows print it (``SpeedRow``): "-" where either time prints as 0."""
    speedup = SpeedRow(s.name, s.channels_last_ms, s.nchw_ms).speedup
    return "-" if speedup is None else f"{speedup:.2f}x"


def _table(stages: tuple[StageTime, ...], marked: StageTime | None) -> str:
    rows = "".join(
        f"<tr{' class=costliest' if s is marked else ''}><td><code>{breakable(s.name)}</code></td>"
        f'<td class="num">{s.channels_last_ms:.2f}</td><td class="num">{s.nchw_ms:.2f}</td>'
        f'<td class="num">{_ratio(s)}</td>'
        f'<td class="num" data-value="{s.extra_bytes}">{format_bytes(s.extra_bytes)}</td></tr>'
        for s in stages
    )
    return (
        '<table class="sortable" id="stages"><thead><tr><th>stage</th>'
        '<th class="num">channels_last ms</th><th class="num">NCHW ms</th>'
        '<th class="num">speedup</th><th class="num">channels_last-only</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def stages_section(speed: Speed | None) -> str:
    """The picture and its table, or why there is none."""
    if speed is None or not speed.stages:
        why = (
            "the speed is unknown"
            if speed is not None and not speed.known
            else "it is recorded when the audit is run with --html and compared with NCHW"
        )
        return f'<p class="dim">No picture of the stages in this report: {why}.</p>'
    stages = speed.stages
    marked = costliest(stages)
    if speed.basis is SpeedBasis.MEASURED:
        how = "measured: each stage's operations' own time in one profiled step per layout"
    else:
        how = "predicted: what each stage's operations add to the step, from the speed table"
    if marked is None:
        where = "channels_last costs no stage anything against NCHW. "
    elif marked.extra_bytes:
        where = f"The most channels_last-only bytes: <b>{esc(marked.name)}</b> (marked). "
    else:
        where = (
            "No stage copies more in channels_last; it loses the most time in "
            f"<b>{esc(marked.name)}</b> (marked). "
        )

    legend = (
        f'<span><i style="background:{_CL}"></i>channels_last</span>'
        f'<span><i style="background:{_NCHW}"></i>NCHW</span>'
        f'<span><i style="background:{_COST}"></i>channels_last-only bytes</span>'
    )
    return (
        f'<p>{where}<span class="dim">The model cut into {len(stages)} stages; times '
        f"{how}.</span></p>"
        f'<div class="legend">{legend}</div>'
        f'<div class="stages">{_svg(stages, marked)}<div>{_table(stages, marked)}</div></div>'
    )
