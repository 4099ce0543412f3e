"""Self-contained HTML for a model report or a sweep: CSS and JavaScript inline, the report's
JSON embedded, nothing fetched. Every string from a report goes through ``html.escape`` (and
the embedded JSON escapes ``<``, ``>`` and ``&``), so a hostile name renders as text.

Pure functions from a report to a string; the script only sorts, filters and jumps.
"""

from __future__ import annotations

import json
from collections import defaultdict

from cl_audit.enums import BucketMatch, Phase, Status, Verdict
from cl_audit.features.ops_index.ranking import report_links
from cl_audit.render import format_bytes
from cl_audit.render import html_text as _e
from cl_audit.render.html_compiled import compiled_section
from cl_audit.render.terminal import (
    cost_line,
    ddp_run_line,
    fsdp_run_line,
    operator_examples,
    predicted_note,
    remedy_lines,
    timing_line,
    verify_text,
)
from cl_audit.report import (
    CostSite,
    Finding,
    ModelReport,
    ModelRow,
    Producer,
    Remedy,
    SiteGroup,
    SweepReport,
    by_call_site,
)
from cl_audit.report.distributed_report import DdpCheck, FsdpCheck
from cl_audit.report.ops_report import OpsIndex
from cl_audit.rule.layout import MemoryLayout

__all__ = ["html_page", "model_html", "sweep_html"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.6em 0 .4em}
.verdict-bad{color:#b3261e}.verdict-good{color:#1e7d32}.dim{color:#667}
table{border-collapse:collapse;margin:.4em 0;width:100%}
th,td{border:1px solid #d7dae0;padding:.25em .45em;text-align:left;vertical-align:top}
th{background:#f1f3f6;cursor:pointer;user-select:none;white-space:nowrap}
td.num,th.num{text-align:right}code{font-size:.92em;overflow-wrap:anywhere}code.op,code.site{white-space:nowrap;overflow-wrap:normal}
.verdict-minor{color:#a86400}
.remedy-verified{color:#1e7d32}.remedy-refuted{color:#a86400}
tr.target{outline:2px solid #f0a020}
.cards{display:flex;gap:.6em;flex-wrap:wrap}.card{border:1px solid #d7dae0;border-radius:6px;
padding:.4em .8em}.card b{display:block;font-size:1.3em}
.strip{display:flex;flex-wrap:wrap;gap:1px;margin:.4em 0}
.ev{width:9px;height:22px;border-top:5px solid transparent}
.ev.channels_last{background:#3b82c4}.ev.contiguous{background:#e0a030}
.ev.ambiguous{background:#b9c2cf}.ev.other{background:#8a6fb3}
.ev.loss{border-top-color:#d62d20}.ev.regain{border-top-color:#1e9e48}
.legend span{display:inline-block;margin-right:1em}.legend i{display:inline-block;width:12px;
height:12px;margin-right:.3em;vertical-align:middle}
.heat{width:auto}.heat td.cell{width:1.6em;text-align:center;cursor:pointer;font-size:.8em}
.heat th.rot{writing-mode:vertical-rl;transform:rotate(180deg);cursor:default}
input[type=search],select{font:inherit;padding:.2em .4em;margin-right:.6em}
td.strides{white-space:nowrap}td.opname{min-width:18em}
details{margin:.3em 0}.phase{font-size:.8em;color:#fff;background:#6b5ba8;padding:0 .3em;
border-radius:3px}
"""

_SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, column) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var numeric = th.classList.contains('num');
      var descending = th.dataset.order !== 'desc';
      th.dataset.order = descending ? 'desc' : 'asc';
      rows.sort(function (a, b) {
        var x = a.cells[column].dataset.value || a.cells[column].textContent;
        var y = b.cells[column].dataset.value || b.cells[column].textContent;
        var order = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
        return descending ? -order : order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
function applyFilter() {
  var text = document.getElementById('filter');
  var status = document.getElementById('status-filter');
  if (!text) { return; }
  var needle = text.value.toLowerCase();
  document.querySelectorAll('table.filterable tbody tr').forEach(function (row) {
    var matches = row.textContent.toLowerCase().indexOf(needle) >= 0;
    var wanted = !status.value || row.dataset.status === status.value;
    row.style.display = matches && wanted ? '' : 'none';
  });
}
['filter', 'status-filter'].forEach(function (id) {
  var input = document.getElementById(id);
  if (input) { input.addEventListener('input', applyFilter); }
});
document.querySelectorAll('[data-jump]').forEach(function (cell) {
  cell.addEventListener('click', function () {
    var target = document.getElementById(cell.dataset.jump);
    if (!target) { return; }
    if (target.tagName === 'DETAILS') { target.open = true; }
    target.scrollIntoView();
    document.querySelectorAll('.target').forEach(function (t) { t.classList.remove('target'); });
    target.classList.add('target');
  });
});
"""

_LAYOUT_COLOURS = {
    MemoryLayout.CHANNELS_LAST: "#3b82c4",
    MemoryLayout.CONTIGUOUS: "#e0a030",
    MemoryLayout.AMBIGUOUS: "#b9c2cf",
    MemoryLayout.OTHER: "#8a6fb3",
}


_MATCH_CLASSES = {
    BucketMatch.MATCHES: "verdict-good",
    BucketMatch.AMBIGUOUS: "verdict-minor",
    BucketMatch.MISMATCHED: "verdict-bad",
}


def _cards(pairs: tuple[tuple[str, object], ...]) -> str:
    return "".join(
        f'<div class="card"><b>{_e(value)}</b>{_e(label)}</div>' for label, value in pairs
    )


def html_page(title: str, body: str, data: dict[str, object]) -> str:
    """A self-contained page: ``body``, the shared style and script, ``data`` embedded."""
    embedded = (
        json.dumps(data, allow_nan=False)
        .replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n{body}\n"
        f'<script type="application/json" id="cl-audit-data">{embedded}</script>\n'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def _producer(producer: Producer | None, anchors: dict[tuple, str]) -> str:
    if producer is None:
        return ""
    name = _e(producer.python_op or producer.aten_op)
    where = f"{_e(producer.module_path or '(root)')} at <code>{_e(producer.call_site)}</code>"
    anchor = anchors.get((producer.python_op, producer.aten_op, producer.call_site))
    if anchor:
        return f'<a href="#{anchor}" data-jump="{anchor}">{name}</a> in {where}'
    return f"{name} in {where}"


def _phase(finding: Finding) -> str:
    """Training audits: the phase of a backward or optimizer event, under its op."""
    if finding.phase is Phase.FORWARD:
        return ""
    return f'<br><span class="phase">{_e(finding.phase.value)}</span>'


def _site_rows(groups: tuple[SiteGroup, ...], prefix: str, anchors: dict[tuple, str]) -> str:
    rows = []
    for index, group in enumerate(groups):
        f = group.first
        anchor = anchors.get((f.python_op, f.aten_op, f.call_site), f"{prefix}-{index}")
        modules = "".join(
            f"<li><code>{_e(path or '(root)')}</code></li>" for path in group.module_paths
        )
        folded = (
            f"<details><summary>{len(group.module_paths)} modules ({_e(f.module_class)})"
            f"</summary><ul>{modules}</ul></details>"
        )
        source, output = (f.inputs[0] if f.inputs else None), (f.outputs[0] if f.outputs else None)
        strides = ""
        if source is not None and output is not None:
            strides = f"{_e(source.shape)}<br>{_e(source.strides)} &rarr; {_e(output.strides)}"
        verdict = f.differential.value if f.differential else ""
        rows.append(
            f'<tr id="{_e(anchor)}"><td><code class="op">{_e(f.python_op or "")}</code><br>'
            f'<code class="op">{_e(f.aten_op or "")}</code>{_phase(f)}</td>'
            f'<td><code class="site">{_e(f.call_site)}</code></td>'
            f"<td>{folded}</td><td>{strides}</td>"
            f'<td class="num">{group.count}</td><td class="num">{group.round_trips}</td>'
            f'<td class="num">{group.terminal}</td><td>{_e(verdict)}</td>'
            f'<td class="num" data-value="{group.bytes_converted}">'
            f"{format_bytes(group.bytes_converted)}{_time(group.time_ms)}</td>"
            f"<td>{_producer(f.root_cause, anchors)}</td></tr>"
        )
    return "".join(rows)


def _time(ms: float | None) -> str:
    return "" if ms is None else f"<br>{ms:.2f} ms"


_SITE_HEAD = (
    "<thead><tr><th>op</th><th>call site</th><th>modules</th><th>tensor: in &rarr; out strides"
    '</th><th class="num">count</th><th class="num">round trips</th><th class="num">terminal'
    '</th><th>NCHW comparison</th><th class="num">converted</th><th>root cause</th></tr></thead>'
)


def _sites_table(findings: tuple[Finding, ...], prefix: str, anchors: dict[tuple, str]) -> str:
    if not findings:
        return '<p class="dim">none</p>'
    body = _site_rows(by_call_site(findings), prefix, anchors)
    return f'<table class="sortable" id="{_e(prefix)}">{_SITE_HEAD}<tbody>{body}</tbody></table>'


def _timeline(report: ModelReport) -> str:
    if not report.timeline:
        return (
            '<p class="dim">No timeline in this report: it is recorded when the audit is run '
            "with --html.</p>"
        )
    cells = []
    for index, event in enumerate(report.timeline):
        mark = f" {event.mark.value}" if event.mark is not None else ""
        tip = (
            f"#{index} {event.op} in {event.module_path or '(root)'}: shape {event.shape}, "
            f"strides {event.strides}, {event.layout.value}"
            + (f", {event.mark.value}" if event.mark is not None else "")
        )
        cells.append(f'<div class="ev {event.layout.value}{mark}" title="{_e(tip)}"></div>')
    legend = "".join(
        f'<span><i style="background:{colour}"></i>{layout.value}</span>'
        for layout, colour in _LAYOUT_COLOURS.items()
    )
    legend += (
        '<span><i style="border-top:4px solid #d62d20"></i>loss</span>'
        '<span><i style="border-top:4px solid #1e9e48"></i>regain</span>'
    )
    marks = sum(1 for e in report.timeline if e.mark is not None)
    return (
        f'<p class="dim">{len(report.timeline)} operations with a 4D/5D output, in order, '
        f"coloured by the layout of their output; {marks} lost or regained the format. "
        "Hover for op, module and strides.</p>"
        f'<div class="legend">{legend}</div><div class="strip" id="timeline">{"".join(cells)}</div>'
    )


def _anchors(report: ModelReport) -> dict[tuple, str]:
    """Where each site's row is, so root causes can link to the row of their producer."""
    anchors: dict[tuple, str] = {}
    for prefix, findings in (
        ("offender", report.offenders),
        ("parameter", report.parameter_conversions),
        ("neutral", report.format_neutral),
    ):
        for index, group in enumerate(by_call_site(findings)):
            f = group.first
            anchors.setdefault((f.python_op, f.aten_op, f.call_site), f"{prefix}-{index}")
    return anchors


def _source(finding: Finding) -> str:
    return finding.regain_source.value if finding.regain_source else ""


_VERDICT_CLASSES = {
    Verdict.OFFENDING: "verdict-bad", Verdict.MINOR: "verdict-minor", Verdict.CLEAN: "verdict-good"
}  # fmt: skip


def _producer_text(producer: Producer | None) -> str:
    if producer is None:
        return ""
    op = producer.python_op or producer.aten_op or "?"
    return f"{op} in {producer.module_path or '(root)'} at {producer.call_site or '?'}"


def _fix_text(site: CostSite) -> str:
    """The fix site, and where the NCHW data began when that was elsewhere."""
    text = _producer_text(site.fix_site)
    if site.root_cause is not None:
        text += f"{'; ' if text else ''}NCHW since {_producer_text(site.root_cause)}"
    return text


def _remedy_cell(remedy: Remedy) -> str:
    """The remedy and how far it is proven; the changes tried, under a fold."""
    head, *trials = remedy_lines(remedy)
    cell = f'<span class="remedy-{_e(remedy.status.value)}">{_e(head)}</span>'
    if trials:
        items = "".join(f"<li>{_e(trial.strip())}</li>" for trial in trials)
        cell += f"<details><summary>changes tried</summary><ul>{items}</ul></details>"
    return cell


def _cost_section(report: ModelReport) -> str:
    """The verdict's figures, then every site where the two runs copied different bytes, the
    costliest first, with its fix site and remedy."""
    cost = report.cost
    if cost is None:
        return (
            f'<p class="dim">Cost not weighed ({_e(report.differential.status.value)}'
            f"{': ' + _e(report.differential.message) if report.differential.message else ''})"
            "; the verdict counts offenders.</p>"
        )
    lines = cost_line(cost, report.environment.train).split("\n")
    tried = verify_text(cost)
    rows = "".join(
        f'<tr><td><code class="op">{_e(site.op)}</code></td><td>{_e(site.kind.value)}, '
        f'{_e(site.phase.value)}</td><td><code class="site">{_e(site.where)}</code>'
        f"</td><td>{_e(site.module_path or '(root)')}</td>"
        f'<td class="num" data-value="{site.extra}">{format_bytes(site.extra)}</td>'
        f'<td class="num" data-value="{site.saved}">{format_bytes(site.saved)}</td>'
        f"<td>{_e(_fix_text(site))}</td><td>"
        + (
            _remedy_cell(site.remedy)
            if site.remedy is not None
            else ('<span class="dim">no known remedy</span>' if site.extra else "")
        )
        + "</td></tr>"
        for site in cost.sites
    )
    mixed = "".join(
        f'<tr><td><code class="op">{_e(m.op)}</code></td><td><code class="site">'
        f"{_e(m.call_site or '?')}</code></td><td>{_e(m.module_path or '(root)')}</td>"
        f'<td class="num">{m.count}</td><td class="num">{format_bytes(m.bytes_read)}</td></tr>'
        for m in cost.mixed
    )
    return (
        f'<p><b>{_e(lines[0])}</b><br><span class="dim">{_e(lines[1])}</span>'
        + (f'<br><span class="dim">{_e(tried)}</span>' if tried else "")
        + "</p>"
        '<table class="sortable" id="cost"><thead><tr><th>op</th><th>kind</th><th>call site'
        '</th><th>module</th><th class="num">channels_last only</th><th class="num">saved</th>'
        "<th>NCHW-ordered data from (fix site)</th><th>remedy</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        + (
            "<details><summary><b>Elementwise operations reading both orders</b> "
            f"({len(cost.mixed)}: strided reads, no copy, not in the cost)</summary>"
            '<table class="sortable" id="mixed"><thead><tr><th>op</th><th>call site</th>'
            '<th>module</th><th class="num">count</th><th class="num">read strided</th></tr>'
            f"</thead><tbody>{mixed}</tbody></table></details>"
            if cost.mixed
            else ""
        )
    )


def _ddp_section(check: DdpCheck) -> str:
    """The step under DDP: a line per configuration, then every 4-D and 5-D parameter's
    strides against its bucket view in each."""
    rows = "".join(
        f"<tr><td>{_e(run.order.value)}</td><td>{run.bucket_view}</td>"
        f"<td><code>{_e(p.name)}</code></td><td>{_e(p.shape)}</td><td>{_e(p.strides)}</td>"
        f"<td>{_e(p.bucket_strides)}</td><td>{_e(p.grad_strides)}</td>"
        f'<td class="{_MATCH_CLASSES[p.match]}">{_e(p.match.value)}</td></tr>'
        for run in check.runs
        for p in run.parameters
    )
    lines = "".join(f"<li>{_e(ddp_run_line(run))}</li>" for run in check.runs)
    advice = f"<p><b>Remedy:</b> {_e(check.advice)}</p>" if check.advice else ""
    agree = "" if check.ranks_agree else " The ranks disagree: rank 0's strides are shown."
    return (
        f"<h2>Under DDP ({_e(check.backend)}, {check.world_size} processes)</h2>"
        f'<ul>{lines}</ul>{advice}<p class="dim">Each parameter\'s strides in the step against '
        "its bucket view (laid out with the strides the parameter had when DDP was built) and "
        f"its gradient's.{_e(agree)}</p>"
        '<table class="sortable" id="ddp"><thead><tr><th>converted</th><th>bucket view</th>'
        "<th>parameter</th><th>shape</th><th>strides</th><th>bucket view</th><th>gradient</th>"
        f"<th>match</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _fsdp_section(check: FsdpCheck) -> str:
    """The FSDP pre-flight: a line per wrapping, then each parameter's strides before and as
    FSDP1 handed them back."""
    lines = "".join(f"<li>{_e(fsdp_run_line(run))}</li>" for run in check.runs)
    rows = "".join(
        f"<tr><td>{_e(run.api)}</td><td>{_e(run.use_orig_params)}</td>"
        f"<td><code>{_e(p.name)}</code></td><td>{_e(p.strides)}</td>"
        f"<td>{_e(p.unflattened)}</td><td>{_e(p.name in run.refused)}</td>"
        f"<td>{_e(p.kept)}</td></tr>"
        for run in check.runs
        for p in run.parameters
    )
    return (
        f"<h2>FSDP pre-flight ({_e(check.backend)}, {check.world_size} processes)</h2>"
        f"<ul>{lines}</ul>"
        '<table class="sortable" id="fsdp"><thead><tr><th>api</th><th>use_orig_params</th>'
        "<th>parameter</th><th>strides</th><th>handed back</th><th>refused</th>"
        f"<th>channels_last kept</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _links(index: OpsIndex, report: ModelReport) -> str:
    from cl_audit.render.html_ops import links_section  # it builds on this module's page

    return "<h2>In torch's operator index</h2>" + links_section(index, report_links(index, report))


def model_html(report: ModelReport, index: OpsIndex | None = None) -> str:
    """One audit: the verdict and the cost by site with fix sites and remedies, then the
    offenders by call site with links to their root causes, the lists kept apart, the
    regains, and the format timeline; with ``index``, the operations that lost the format
    linked to their rows of the operator index."""
    s, env = report.summary, report.environment
    verdict = report.verdict.value
    anchors = _anchors(report)
    cards = _cards(
        (
            ("losses (offenders)", s.losses),
            ("round trips", s.round_trips),
            ("terminal", s.terminal_conversions),
            ("regains", s.regains),
            ("converted", format_bytes(s.bytes_converted)),
            ("parameter conversions", s.parameter_conversions),
            ("format-neutral", s.format_neutral),
        )
    )
    regains = "".join(
        f'<tr><td><code class="op">{_e(f.op)}</code></td>'
        f'<td><code class="site">{_e(f.call_site)}</code></td>'
        f"<td>{_e(f.module_path or '(root)')}</td><td>{_e(_source(f))}</td>"
        f'<td class="num">{f.count}</td><td>{_e(f.provenance.value)}</td>'
        f"<td>{_producer(f.root_cause, anchors)}</td></tr>"
        for f in report.regains
    )
    predicted = predicted_note(report)
    if env.train:
        predicted += f"; a training step (optimizer {env.optimizer})"
    body = (
        f'<h1>cl-audit: {_e(report.model or "(unnamed)")} <span class="'
        f'{_VERDICT_CLASSES[report.verdict]}">{verdict}</span></h1>'
        f'<p class="dim">input {_e(report.input_shape)}, {_e(env.device)} {_e(env.dtype)}'
        f"{', autocast ' + _e(env.autocast) if env.autocast else ''}, "
        f"engine {_e(env.engine.value)}, "
        f"{_e(env.mode.value)} mode{predicted}; {s.calls_checked} calls checked; NCHW comparison "
        f"{_e(report.differential.status.value)}"
        f"{': ' + _e(report.differential.message) if report.differential.message else ''}; "
        f"cl-audit {_e(env.tool)}, torch {_e(env.torch)}</p>"
        f'<div class="cards">{cards}</div>'
        + (f"<p>{_e(timing_line(report.timing))}</p>" if report.timing else "")
        + "<h2>What channels_last costs, against NCHW</h2>"
        + _cost_section(report)
        + (
            "<h2>torch.compile: Inductor's layout decision per graph</h2>"
            + compiled_section(report.compiled)
            if report.compiled is not None
            else ""
        )
        + (_links(index, report) if index is not None else "")
        + (_ddp_section(report.ddp) if report.ddp is not None else "")
        + (_fsdp_section(report.fsdp) if report.fsdp is not None else "")
        + "<h2>Offenders, by operation and call site</h2>"
        + _sites_table(report.offenders, "offender", anchors)
        + "<h2>Format timeline</h2>"
        + _timeline(report)
        + "<details><summary><b>Conversions of parameter-derived data</b> "
        f"({s.parameter_conversions}, {format_bytes(s.parameter_bytes)} per forward)</summary>"
        + _sites_table(report.parameter_conversions, "parameter", anchors)
        + "</details><details><summary><b>Format-neutral losses</b> "
        f"({s.format_neutral}, the same copy happens in NCHW)</summary>"
        + _sites_table(report.format_neutral, "neutral", anchors)
        + f"</details><details><summary><b>Regains</b> ({len(report.regains)} sites)</summary>"
        '<table class="sortable" id="regains"><thead><tr><th>op</th><th>call site</th>'
        '<th>module</th><th>source</th><th class="num">count</th><th>provenance</th>'
        f"<th>root cause</th></tr></thead><tbody>{regains}</tbody></table></details>"
    )
    return html_page(f"cl-audit: {report.model or 'report'}", body, report.to_dict())


def _model_row(row: ModelRow) -> str:
    s = row.summary
    converted = s.bytes_converted if s else 0
    extra = row.cost.extra_bytes if row.cost else 0
    share = row.cost.share if row.cost else 0.0
    return (
        f'<tr data-status="{_e(row.status.value)}"><td><a href="#model-{_e(row.key)}" '
        f'data-jump="model-{_e(row.key)}">{_e(row.name)}</a></td><td>{_e(row.source.value)}</td>'
        f"<td>{_e(row.status.value)}</td><td>{_e(row.mode.value)}</td>"
        f"<td>{_e(row.verdict.value if row.verdict else '')}</td>"
        f'<td class="num" data-value="{extra}">{format_bytes(extra)}</td>'
        f'<td class="num" data-value="{share}">{share:.2%}</td>'
        f'<td class="num">{len(row.offenders)}</td>'
        f'<td class="num">{s.losses if s else 0}</td>'
        f'<td class="num" data-value="{converted}">{format_bytes(converted)}</td>'
        f'<td class="num">{s.parameter_conversions if s else 0}</td>'
        f'<td class="num">{s.format_neutral if s else 0}</td>'
        f"<td>{_e(row.message or '')}</td></tr>"
    )


def _heatmap(report: SweepReport) -> str:
    """Offending models by operator: the channels_last-only bytes of each model's cost sites at
    each op where the sweep weighed a cost, else its offender events (reports before costs)."""
    offending = [row for row in report.models if row.offending]
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
    head = "".join(f'<th class="rot" title="{_e(op)}">{_e(op)}</th>' for op in ops)
    rows = []
    for row in offending:
        cells = []
        for op in ops:
            n = values[row.key].get(op, 0)
            style = f' style="background:rgba(214,45,32,{0.15 + 0.85 * n / peak:.2f})"' if n else ""
            shown = (format_bytes(n) if weighed else str(n)) if n else ""
            cells.append(
                f'<td class="cell"{style} title="{_e(row.name)} / {_e(op)}: {_e(shown)}" '
                f'data-jump="model-{_e(row.key)}">{_e(shown)}</td>'
            )
        rows.append(
            f'<tr><th data-jump="model-{_e(row.key)}">{_e(row.name)}</th>{"".join(cells)}</tr>'
        )
    return (
        f'<table class="heat" id="heatmap"><thead><tr><th>model</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _findings_by_model(report: SweepReport) -> str:
    parts = []
    for row in report.models:
        if not row.offending:
            continue
        table = _sites_table(row.offenders, f"sites-{row.key}", {})
        parts.append(
            f'<details id="model-{_e(row.key)}"><summary><b>{_e(row.name)}</b> '
            f"({_e(row.source.value)}, {len(row.offenders)} offender findings)</summary>"
            f"{table}</details>"
        )
    return "".join(parts)


def sweep_html(report: SweepReport) -> str:
    """A sweep: status counts, the models (sortable, filterable), the operator index, and the
    models by operators matrix of the offending models, each linked to its findings."""
    s, env = report.summary, report.environment
    cards = _cards(
        (
            ("models", s.models),
            ("offending", s.offending),
            ("minor", s.minor),
            ("clean", s.clean),
            ("failed", s.failed),
            ("skipped", s.skipped),
        )
    )
    statuses = "".join(f'<option value="{st.value}">{st.value}</option>' for st in Status)
    examples = operator_examples(report)
    operators = "".join(
        f'<tr><td><code class="op">{_e(c.op)}</code></td>'
        f'<td class="num" data-value="{c.extra_bytes}">{format_bytes(c.extra_bytes)}</td>'
        f'<td class="num">{c.cost_models}</td><td>{_e(", ".join(c.python_ops))}</td>'
        f'<td class="num">{c.models}</td><td class="num">{c.events}</td>'
        f'<td class="num" data-value="{c.bytes_converted}">{format_bytes(c.bytes_converted)}</td>'
        f'<td class="num">{c.parameter_models}</td><td class="num">{c.neutral_models}</td>'
        f"<td>{_e(', '.join(examples.get(c.op, ())[:3]))}</td></tr>"
        for c in report.operators
    )
    body = (
        f"<h1>cl-audit sweep: {s.models} models</h1>"
        f'<p class="dim">{_e(env.device)} {_e(env.dtype)}, {_e(env.mode.value)} mode, engine '
        f"{_e(env.engine.value)}; cl-audit {_e(env.tool)}, torch {_e(env.torch)}</p>"
        f'<div class="cards">{cards}</div><h2>Models</h2>'
        '<input type="search" id="filter" placeholder="filter models">'
        f'<select id="status-filter"><option value="">any status</option>{statuses}</select>'
        '<table class="sortable filterable" id="models"><thead><tr><th>model</th><th>source</th>'
        '<th>status</th><th>mode</th><th>verdict</th><th class="num">channels_last only</th>'
        '<th class="num">share</th><th class="num">offender sites</th>'
        '<th class="num">losses</th><th class="num">converted</th>'
        '<th class="num">parameter</th><th class="num">neutral</th><th>message</th></tr>'
        f"</thead><tbody>{''.join(_model_row(r) for r in report.models)}</tbody></table>"
        "<h2>Operator coverage, by channels_last-only cost</h2>"
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
