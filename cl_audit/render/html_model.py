"""The HTML report of one audit: the cost sites, the findings, the format timeline, the distributed
checks and the operator index's links."""

from __future__ import annotations

from cl_audit.enums import BucketMatch, Phase, Verdict
from cl_audit.features.ops_index.ranking import report_links
from cl_audit.render.html_compiled import compiled_section
from cl_audit.render.html_cost import cost_section
from cl_audit.render.html_ops import links_section
from cl_audit.render.html_page import breakable, esc, html_page, json_block, summary_cards
from cl_audit.render.html_stages import stages_section
from cl_audit.render.wording import (
    compiled_rows,
    ddp_run_line,
    format_bytes,
    fsdp_run_line,
    headline_lines,
    predicted_note,
    speed_lines,
    table_warning,
    timing_line,
)
from cl_audit.report import (
    Finding,
    ModelReport,
    Producer,
    SiteGroup,
    by_call_site,
)
from cl_audit.report.distributed_report import DdpCheck, FsdpCheck
from cl_audit.report.ops_report import OpsIndex
from cl_audit.report.speed_report import Speed, SpeedRow
from cl_audit.rule.layout import MemoryLayout

_MATCH_CLASSES = {
    BucketMatch.MATCHES: "verdict-good",
    BucketMatch.AMBIGUOUS: "verdict-minor",
    BucketMatch.MISMATCHED: "verdict-bad",
}


__all__ = ["model_html"]


_LAYOUT_COLOURS = {
    MemoryLayout.CHANNELS_LAST: "#3b82c4",
    MemoryLayout.CONTIGUOUS: "#e0a030",
    MemoryLayout.AMBIGUOUS: "#b9c2cf",
    MemoryLayout.OTHER: "#8a6fb3",
}


def _producer(producer: Producer | None, anchors: dict[tuple, str]) -> str:
    if producer is None:
        return ""
    name = esc(producer.python_op or producer.aten_op)
    where = (
        f"{breakable(producer.module_path or '(root)')} at "
        f"<code>{breakable(producer.call_site)}</code>"
    )
    anchor = anchors.get((producer.python_op, producer.aten_op, producer.call_site))
    if anchor:
        return f'<a href="#{anchor}" data-jump="{anchor}">{name}</a> in {where}'
    return f"{name} in {where}"


def _phase(finding: Finding) -> str:
    """Training audits: the phase of a backward or optimizer event, under its op."""
    if finding.phase is Phase.FORWARD:
        return ""
    return f'<br><span class="phase">{esc(finding.phase.value)}</span>'


def _site_rows(groups: tuple[SiteGroup, ...], prefix: str, anchors: dict[tuple, str]) -> str:
    rows = []
    for index, group in enumerate(groups):
        f = group.first
        anchor = anchors.get((f.python_op, f.aten_op, f.call_site), f"{prefix}-{index}")
        folded = _modules(group)
        source, output = (f.inputs[0] if f.inputs else None), (f.outputs[0] if f.outputs else None)
        strides = ""
        if source is not None and output is not None:
            strides = f"{esc(source.shape)}<br>{esc(source.strides)} &rarr; {esc(output.strides)}"
        verdict = f.differential.value if f.differential else ""
        rows.append(
            f'<tr id="{esc(anchor)}"><td><code class="op">{esc(f.python_op or "")}</code><br>'
            f'<code class="op aten">{breakable(f.aten_op or "")}</code>{_phase(f)}</td>'
            f'<td><code class="site">{breakable(f.call_site)}</code></td>'
            f"<td>{folded}</td><td>{strides}</td>"
            f'<td class="num">{group.count}</td><td class="num">{group.round_trips}</td>'
            f'<td class="num">{group.terminal}</td><td>{esc(verdict)}</td>'
            f'<td class="num" data-value="{group.bytes_converted}">'
            f"{format_bytes(group.bytes_converted)}{_time(group.time_ms)}</td>"
            f"<td>{_producer(f.root_cause, anchors)}</td></tr>"
        )
    return "".join(rows)


def _modules(group: SiteGroup) -> str:
    """A group's modules, folded (one: its path)."""
    paths = group.module_paths
    if len(paths) == 1:
        return f"<code>{esc(paths[0] or '(root)')}</code>"
    items = "".join(f"<li><code>{esc(path or '(root)')}</code></li>" for path in paths)
    return (
        f"<details><summary>{len(paths)} modules ({esc(group.first.module_class)})"
        f"</summary><ul>{items}</ul></details>"
    )


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
    table = f'<table class="sortable sites" id="{esc(prefix)}">'
    return f"{table}{_SITE_HEAD}<tbody>{body}</tbody></table>"


def _timeline(report: ModelReport) -> str:
    if not report.timeline:
        return (
            '<p class="dim">No timeline in this report: it is recorded when the audit is run '
            "with --html.</p>"
        )
    # A cell per event; the tooltips (op, module, shape, strides) are written by the page's
    # script from one JSON block of the events, each op and module named once: a tenth of
    # the bytes of a title on every cell (thousands in a training step).
    ops: dict[str, int] = {}
    modules: dict[str, int] = {}
    cells, events = [], []
    for event in report.timeline:
        mark = f" {event.mark.value}" if event.mark is not None else ""
        cells.append(f'<i class="ev {event.layout.value}{mark}"></i>')
        op = ops.setdefault(event.op, len(ops))
        module = modules.setdefault(event.module_path or "(root)", len(modules))
        events.append((op, module, event.shape, event.strides))
    data = json_block({"ops": list(ops), "modules": list(modules), "events": events})
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
        f'<script type="application/json" id="timeline-data">{data}</script>'
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


def _ddp_section(check: DdpCheck) -> str:
    """The step under DDP: a line per configuration, then every 4-D and 5-D parameter's
    strides against its bucket view in each."""
    rows = "".join(
        f"<tr><td>{esc(run.order.value)}</td><td>{run.bucket_view}</td>"
        f"<td><code>{esc(p.name)}</code></td><td>{esc(p.shape)}</td><td>{esc(p.strides)}</td>"
        f"<td>{esc(p.bucket_strides)}</td><td>{esc(p.grad_strides)}</td>"
        f'<td class="{_MATCH_CLASSES[p.match]}">{esc(p.match.value)}</td></tr>'
        for run in check.runs
        for p in run.parameters
    )
    lines = "".join(f"<li>{esc(ddp_run_line(run))}</li>" for run in check.runs)
    advice = f"<p><b>Remedy:</b> {esc(check.advice)}</p>" if check.advice else ""
    agree = "" if check.ranks_agree else " The ranks disagree: rank 0's strides are shown."
    return (
        f"<h2>Under DDP ({esc(check.backend)}, {check.world_size} processes)</h2>"
        f'<ul>{lines}</ul>{advice}<p class="dim">Each parameter\'s strides in the step against '
        "its bucket view (laid out with the strides the parameter had when DDP was built) and "
        f"its gradient's.{esc(agree)}</p>"
        '<table class="sortable" id="ddp"><thead><tr><th>converted</th><th>bucket view</th>'
        "<th>parameter</th><th>shape</th><th>strides</th><th>bucket view</th><th>gradient</th>"
        f"<th>match</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _fsdp_section(check: FsdpCheck) -> str:
    """The FSDP pre-flight: a line per wrapping, then each parameter's strides before and as
    FSDP1 handed them back."""
    lines = "".join(f"<li>{esc(fsdp_run_line(run))}</li>" for run in check.runs)
    rows = "".join(
        f"<tr><td>{esc(run.api)}</td><td>{esc(run.use_orig_params)}</td>"
        f"<td><code>{esc(p.name)}</code></td><td>{esc(p.strides)}</td>"
        f"<td>{esc(p.unflattened)}</td><td>{esc(p.name in run.refused)}</td>"
        f"<td>{esc(p.kept)}</td></tr>"
        for run in check.runs
        for p in run.parameters
    )
    return (
        f"<h2>FSDP pre-flight ({esc(check.backend)}, {check.world_size} processes)</h2>"
        f"<ul>{lines}</ul>"
        '<table class="sortable" id="fsdp"><thead><tr><th>api</th><th>use_orig_params</th>'
        "<th>parameter</th><th>strides</th><th>handed back</th><th>refused</th>"
        f"<th>channels_last kept</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _speed_row(r: SpeedRow) -> str:
    return (
        f"<tr><td>{esc(r.label)}</td>"
        f'<td class="num" data-value="{r.channels_last_ms}">{r.channels_last_ms:.2f} ms</td>'
        f'<td class="num" data-value="{r.nchw_ms}">{r.nchw_ms:.2f} ms</td>'
        f'<td class="num">{f"{r.speedup:.2f}x" if r.speedup is not None else "-"}</td></tr>'
    )


def _speed_section(speed: Speed) -> str:
    """Does channels_last pay: the headline, the time by operation class (the step's row in
    the table's foot, which sorting leaves in place), how it was had."""
    rows = speed.rows()
    body = "".join(_speed_row(r) for r in rows if not r.total)
    foot = "".join(_speed_row(r) for r in rows if r.total)
    table = (
        '<table class="sortable" id="speed"><thead><tr><th>class</th>'
        '<th class="num">channels_last</th><th class="num">NCHW</th>'
        f'<th class="num">speedup</th></tr></thead><tbody>{body}</tbody>'
        f"<tfoot>{foot}</tfoot></table>"
        if body
        else ""
    )
    notes = "".join(f'<p class="dim">{esc(line)}</p>' for line in speed_lines(speed))
    compiled = speed.compiled
    if compiled is not None and compiled.classes:
        rows = "".join(
            f'<tr><td>{esc(label)}</td><td class="num">{esc(cl)}</td>'
            f'<td class="num">{esc(nchw)}</td></tr>'
            for label, cl, nchw in compiled_rows(compiled)
        )
        how = esc(compiled.options.described)
        table += (
            f'<h3>Compiled ({how})</h3><table id="compiled-speed"><thead><tr>'
            '<th></th><th class="num">channels_last</th><th class="num">NCHW</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>"
        )
        if compiled.note:
            table += f'<p class="dim">{esc(compiled.note)}</p>'

    warning = table_warning(speed)
    warn = f'<p class="warn">{esc(warning)}</p>' if warning else ""
    head = f"<h2>Does channels_last pay?</h2><p>{esc(speed.headline())}</p>{warn}"
    return f"{head}{table}{notes}"


def _links(index: OpsIndex, report: ModelReport) -> str:
    return "<h2>In torch's operator index</h2>" + links_section(index, report_links(index, report))


def _headline(report: ModelReport) -> str:
    """The terminal's headline in its words: both verdicts, what fixing the sites gains, whose
    table, and which verdict the exit code follows."""
    lines = headline_lines(report)
    if not lines:
        return ""
    first, *rest = lines
    more = "".join(f'<br><span class="dim">{esc(line)}</span>' for line in rest)
    return f'<p class="headline"><b>{esc(first)}</b>{more}</p>'


def model_html(report: ModelReport, index: OpsIndex | None = None) -> str:
    """One audit: the verdict and the cost by site with fix sites and remedies, then the
    offenders by call site with links to their root causes, the lists kept apart, the
    regains, and the format timeline; with ``index``, the operations that lost the format
    linked to their rows of the operator index."""
    s, env = report.summary, report.environment
    verdict = report.verdict.value
    anchors = _anchors(report)
    cards = summary_cards(
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
    regains = "".join(  # by operation and call site, as the offenders, the modules folded
        f'<tr><td><code class="op">{esc(g.first.op)}</code>{_phase(g.first)}</td>'
        f'<td><code class="site">{breakable(g.first.call_site)}</code></td>'
        f"<td>{_modules(g)}</td><td>{esc(_source(g.first))}</td>"
        f'<td class="num">{g.count}</td><td>{esc(g.first.provenance.value)}</td>'
        f"<td>{_producer(g.first.root_cause, anchors)}</td></tr>"
        for g in by_call_site(report.regains)
    )
    predicted = predicted_note(report)
    if env.train:
        predicted += f"; a training step (optimizer {env.optimizer})"
    body = (
        f'<h1>cl-audit: {esc(report.model or "(unnamed)")} <span class="'
        f'{_VERDICT_CLASSES[report.verdict]}">{verdict}</span></h1>'
        + _headline(report)
        + f'<p class="dim">input {esc(report.input_shape)}, {esc(env.device)} {esc(env.dtype)}'
        f"{', autocast ' + esc(env.autocast) if env.autocast else ''}, "
        f"engine {esc(env.engine.value)}, "
        f"{esc(env.mode.value)} mode{predicted}; {s.calls_checked} calls checked; NCHW comparison "
        f"{esc(report.differential.status.value)}"
        f"{': ' + esc(report.differential.message) if report.differential.message else ''}; "
        f"cl-audit {esc(env.tool)}, torch {esc(env.torch)}</p>"
        f'<div class="cards">{cards}</div>'
        + (f"<p>{esc(timing_line(report.timing))}</p>" if report.timing else "")
        + "<h2>Where in the model the time and the copies go</h2>"
        + stages_section(report.speed)
        + "<h2>What channels_last costs, against NCHW</h2>"
        + cost_section(report)
        + (_speed_section(report.speed) if report.speed is not None else "")
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
