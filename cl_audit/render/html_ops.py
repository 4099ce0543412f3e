"""The operator coverage index as one self-contained HTML page (``cl-audit ops --html``): the
counts, then every operator (sortable, filterable by text and behaviour), each row at the
anchor ``op-<name>`` that a model report's links point to (``ops_anchor``)."""

from __future__ import annotations

from cl_audit.enums import OpBehaviour
from cl_audit.features.ops_index.ranking import OpLink
from cl_audit.render.html_page import esc, html_page
from cl_audit.render.wording import (
    format_bytes,
)
from cl_audit.report.ops_report import OperatorRow, OpsIndex, SampleResult

__all__ = ["links_section", "ops_anchor", "ops_html"]

_ORDER = {b: i for i, b in enumerate(OpBehaviour)}
_STYLE = {
    OpBehaviour.REFUSES: "verdict-bad",
    OpBehaviour.LOSES: "verdict-bad",
    OpBehaviour.OTHER: "verdict-minor",
    OpBehaviour.COPIES: "verdict-minor",
    OpBehaviour.KEEPS: "verdict-good",
}


def ops_anchor(op: str) -> str:
    """The id of ``op``'s row in the page."""
    return "op-" + op


def _strides(shape: tuple[int, ...] | None, strides: tuple[int, ...] | None) -> str:
    if strides is None:
        return ""
    return f"{tuple(shape or ())} {tuple(strides)}"


def _example(e: SampleResult | None) -> str:
    if e is None:
        return "<td></td><td></td><td></td>"
    copied = "" if not e.copied else f" ({format_bytes(e.copied)} copied inside)"
    return (
        f'<td class="strides"><code>{esc(_strides(e.input_shape, e.input_strides))}</code></td>'
        f'<td class="strides"><code>{esc(_strides(e.output_shape, e.output_strides))}</code></td>'
        f"<td>{esc((e.note or '') + copied)}</td>"
    )


def _cases(row: OperatorRow) -> str:
    """Each case's behaviour (a mixed case's: the output's layout), in a line."""
    layout = {OpBehaviour.KEEPS: "channels_last", OpBehaviour.LOSES: "NCHW"}
    return "; ".join(
        f"{c.case}: " + (layout.get(c.behaviour, c.behaviour.value) if c.mixed
                         else c.behaviour.value)
        for c in row.cases
    )  # fmt: skip


def _cases_cell(row: OperatorRow) -> str:
    """The cases folded under their count (a row stays one line until opened)."""
    if not row.cases:
        return ""
    return f"<details><summary>{len(row.cases)} cases</summary>{esc(_cases(row))}</details>"


def _row(row: OperatorRow) -> str:
    word = row.behaviour.value if row.behaviour else "error"
    style = _STYLE.get(row.behaviour, "") if row.behaviour else "verdict-bad"
    counts = ", ".join(f"{b.value} {n}" for b, n in row.counts)
    gradient = ", ".join(f"{b.value} {n}" for b, n in row.gradient_counts)
    example = f"<td colspan=3>{esc(row.error)}</td>" if row.error else _example(row.example)
    return (
        f'<tr id="{esc(ops_anchor(row.op))}" data-status="{esc(word)}">'
        f'<td class="opname"><code>{esc(row.op)}</code></td>'
        f'<td class="{style}" data-value="{_ORDER.get(row.behaviour, -1)}">{esc(word)}</td>'
        f"<td>{esc(counts)}</td><td>{esc(gradient)}</td>"
        f"<td>{esc(', '.join(row.aten_ops))}</td>{example}<td>{_cases_cell(row)}</td></tr>"
    )


def ops_html(index: OpsIndex) -> str:
    """Every row of ``index``, worst first."""
    how = "predicted on fake tensors (no kernel ran)" if index.predicted else "eager"
    cards = "".join(
        f'<div class="card"><b>{index.count(b)}</b>{esc(b.value)}</div>'
        for b in OpBehaviour
        if index.count(b)
    )
    options = "".join(f'<option value="{b.value}">{b.value}</option>' for b in OpBehaviour)
    rows = "".join(
        _row(r) for r in sorted(index.rows, key=lambda r: (_ORDER.get(r.behaviour, -1), r.op))
    )
    unjudged = index.gradients_not_judged
    note = f'<p class="dim">note: {esc(unjudged)}</p>' if unjudged else ""
    body = (
        f"<h1>cl-audit ops: {len(index.rows)} operators</h1>"
        f'<p class="dim">torch {esc(index.torch)}, {esc(index.device)} {esc(index.dtype)}, {how}; '
        f"{index.without_map} operators that take no 4-D input (listed below); "
        f"{index.seconds:.1f} s</p>"
        f"{note}"
        f'<div class="cards">{cards}</div>'
        '<input type="search" id="filter" placeholder="filter operators">'
        f'<select id="status-filter"><option value="">any behaviour</option>{options}'
        '<option value="error">error</option></select>'
        '<table class="sortable filterable" id="operators"><thead><tr><th>operator</th>'
        "<th>forward</th><th>samples</th><th>gradient</th><th>made by</th>"
        "<th>example input</th><th>output</th><th>note</th><th>by case</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        f"{_unjudged(index)}"
    )
    return html_page(f"cl-audit ops: torch {index.torch}", body, index.to_dict())


def _unjudged(index: OpsIndex) -> str:
    if not index.unjudged:
        return ""
    items = "".join(
        f"<tr><td><code>{esc(u.op)}</code></td><td>{esc(u.reason)}</td></tr>"
        for u in index.unjudged
    )
    return (
        f"<h2>Not judged: {len(index.unjudged)} operators</h2>"
        '<table class="sortable" id="unjudged"><thead><tr><th>operator</th><th>why</th></tr>'
        f"</thead><tbody>{items}</tbody></table>"
    )


def links_section(index: OpsIndex, links: tuple[OpLink, ...]) -> str:
    """A model report's operations that lost channels_last, each linked to its rows of
    ``index``, which follow (the anchors ``op-<name>``)."""
    how = ", predicted" if index.predicted else ""
    cells = "".join(
        f'<tr><td><code class="op">{esc(link.python_op or "-")}</code> '
        f'<span class="dim">{esc(link.aten_op or "")}</span></td>'
        f'<td class="num" data-value="{link.bytes}">{format_bytes(link.bytes)} '
        f"{'channels_last only' if link.extra else 'converted'}</td><td>"
        + ", ".join(f'<a href="#{esc(ops_anchor(r.op))}">{esc(r.op)}</a>' for r in link.rows)
        + f"</td><td>{esc(link.reading)}</td></tr>"
        for link in links
    )
    shown = {row.op: row for link in links for row in link.rows}
    rows = "".join(_row(r) for r in sorted(shown.values(), key=lambda r: r.op))
    return (
        f'<p class="dim">torch {esc(index.torch)}, {esc(index.device)} {esc(index.dtype)}{how}: '
        "does each operation lose the format in torch's own samples too, or only here?</p>"
        '<table class="sortable" id="op-links"><thead><tr><th>operation</th>'
        '<th class="num">bytes</th><th>index rows</th><th>reading</th></tr>'
        f"</thead><tbody>{cells}</tbody></table>"
        '<table class="sortable" id="operators"><thead><tr><th>operator</th>'
        "<th>forward</th><th>samples</th><th>gradient</th><th>made by</th>"
        "<th>example input</th><th>output</th><th>note</th><th>by case</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
