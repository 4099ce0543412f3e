"""The terminal report of one audit (rich): the summary panel, the cost sites and the offenders."""

from __future__ import annotations

import re

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cl_audit.enums import (
    DifferentialStatus,
    RemedyStatus,
    Verdict,
)
from cl_audit.features.ops_index.ranking import report_links
from cl_audit.render.ops_table import render_op_links
from cl_audit.render.terminal_features import (
    compiled_speed_table,
    compiled_text,
    ddp_lines,
    fsdp_lines,
    speed_table,
)
from cl_audit.render.wording import (
    cost_line,
    format_bytes,
    headline_lines,
    mixed_line,
    module_text,
    plural,
    predicted_note,
    remedies_given_above,
    remedy_head,
    remedy_reference,
    speed_lines,
    timing_line,
    trial_figures,
    trial_text,
    verify_text,
)
from cl_audit.report import (
    Cost,
    CostSite,
    Finding,
    ModelReport,
    Producer,
    SiteGroup,
    TensorSummary,
    by_call_site,
)
from cl_audit.report.ops_report import OpsIndex
from cl_audit.report.verdict import group_sites

__all__ = [
    "CallSite",
    "cost_table",
    "offenders_table",
    "render_report",
    "summary_text",
    "trials_text",
]


def _strides(t: TensorSummary) -> str:
    return "(" + ",".join(map(str, t.strides)) + ")"


def _tensors_cell(finding: Finding) -> str:
    """Shape of the first channels_last-ish input, then input and output strides."""
    source = next((t for t in finding.inputs if t.layout.value != "contiguous"), None)
    source = source or (finding.inputs[0] if finding.inputs else None)
    output = finding.outputs[0] if finding.outputs else None
    if source is None or output is None:
        return ""
    shape = "x".join(map(str, source.shape))
    return f"{shape} {source.dtype} {_strides(source)} -> {_strides(output)}"


def _producer_cell(producer: Producer | None, mixed: bool) -> str:
    if producer is None:
        return "mixed formats, producer unseen" if mixed else ""
    op = producer.python_op or producer.aten_op or "?"
    where = module_text(producer.module_path, producer.module_class)
    return f"{op} in {where} at {producer.call_site or '?'}"


def _differential_line(report: ModelReport) -> str:
    run = report.differential
    if run.status is DifferentialStatus.RAN:
        line = "terminal losses compared with an NCHW run"
        return line + (f" ({run.unaligned} unaligned, counted as caused)" if run.unaligned else "")
    if run.status is DifferentialStatus.NOT_NEEDED:
        return "no terminal loss to compare with an NCHW run"
    return f"NCHW comparison {run.status.value}: {run.message}"


def summary_text(report: ModelReport) -> Text:
    s, env = report.summary, report.environment
    amp = f", autocast {env.autocast}" if env.autocast else ""
    mode = predicted_note(report)
    lines = headline_lines(report)
    lines += [
        f"model {report.model or '(unnamed)'}  input {'x'.join(map(str, report.input_shape or ()))}"
        f"  {env.device} {env.dtype}{amp}  engine {env.engine.value}{mode}",
    ]
    if report.cost is not None:
        lines.append(cost_line(report.cost, env.train))
        tried = verify_text(report.cost)
        lines += [tried] if tried else []
    else:
        lines.append("cost not weighed: " + _differential_line(report))
    lines += [
        f"{plural(s.calls_checked, 'call')} checked, {plural(s.distinct_ops, 'distinct op')}",
        f"{plural(s.losses, 'loss', 'losses')} at "
        f"{plural(len(by_call_site(report.offenders)), 'call site')} "
        f"({plural(s.offending_ops, 'distinct op')}): "
        f"{plural(s.round_trips, 'round trip')}, {s.terminal_conversions} terminal; "
        f"{plural(s.regains, 'regain')}; {format_bytes(s.bytes_converted)} converted",
        f"not offenders: {plural(s.parameter_conversions, 'parameter conversion')} "
        f"({format_bytes(s.parameter_bytes)}), "
        f"{plural(s.format_neutral, 'format-neutral loss', 'format-neutral losses')} "
        f"({format_bytes(s.format_neutral_bytes)})",
    ]
    if report.cost is not None and report.differential.unaligned:
        lines.append(_differential_line(report))
    if report.timing is not None:
        lines.append(timing_line(report.timing))
    return Text("\n".join(lines))


def _modules_cell(group: SiteGroup) -> str:
    first = group.first
    where = module_text(group.module_paths[0], first.module_class)
    others = len(group.module_paths) - 1
    return where + (f" and {plural(others, 'more module')}" if others else "")


class CallSite:
    """A ``file:line`` that never breaks inside: in a narrower cell it is shortened from the
    left with an ellipsis, so the line number always shows."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 2)
        shown = self.text if len(self.text) <= width else "…" + self.text[-(width - 1) :]
        yield Text(shown, style="cyan", no_wrap=True, overflow="crop")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        line = self.text.rpartition("/")[2]  # at the least the file's own name and line
        return Measurement(min(len(line) + 1, len(self.text)), len(self.text))


class Wrapped:
    """Markup wrapped at the width its cell gets, a dotted name longer than that width (a deep
    module path) broken after one of its dots rather than mid-name."""

    def __init__(self, markup: str) -> None:
        self.text = Text.from_markup(markup, overflow="fold")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        plain, width = self.text.plain, max(options.max_width, 2)
        cuts = []
        for word in re.finditer(r"\S+", plain):
            at, end = word.span()
            while end - at > width:
                dot = plain.rfind(".", at, at + width)
                if dot <= at:
                    break  # no dot to break at: folded where the width ends
                cuts.append(dot + 1)
                at = dot + 1
        if not cuts:
            yield self.text
            return
        joined = Text("\n").join(self.text.divide(cuts))
        joined.overflow = "fold"
        yield joined

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.text)


def offenders_table(
    findings: tuple[Finding, ...], title: str = "Operations that lose channels_last"
) -> Table:
    """One row per operation and call site, the modules it ran in folded into the row."""
    table = Table(title=title, show_lines=True, expand=True)
    table.add_column("op", style="bold", no_wrap=True)
    table.add_column("where; tensor: in -> out strides", overflow="fold", ratio=1)
    table.add_column("count", justify="right", no_wrap=True)
    for group in by_call_site(findings):
        f = group.first
        op = f"{f.python_op}\n{f.aten_op}" if f.python_op and f.aten_op else f.op
        where = _modules_cell(group)
        tensors = _tensors_cell(f)
        if tensors:
            where += f"\n[dim]{tensors}[/dim]"
        cause = _producer_cell(f.root_cause, f.mixed_formats)
        if cause:
            where += f"\n[magenta]root cause: {cause}[/magenta]"
        trips = plural(group.round_trips, "round trip")
        kinds = [trips] * bool(group.round_trips) + [f"{group.terminal} terminal"] * bool(
            group.terminal
        )
        if group.terminal and f.differential:
            kinds.append(f"({f.differential.value})")
        kinds.append(format_bytes(group.bytes_converted))
        if group.time_ms is not None:
            kinds.append(f"{group.time_ms:.2f} ms")
        cell = Group(CallSite(f.call_site or "?"), Wrapped(where))
        table.add_row(op, cell, "\n".join([str(group.count), *kinds]))
    return table


_VERDICT_STYLES = {Verdict.OFFENDING: "red", Verdict.MINOR: "yellow", Verdict.CLEAN: "green"}


_REMEDY_STYLES = {
    RemedyStatus.VERIFIED: "green",
    RemedyStatus.LEAD: "cyan",
    RemedyStatus.REFUTED: "yellow",
}


def _fix_cell(site: CostSite, train: bool, given_above: str | None) -> str:
    """Where, the fix site, the root cause and the remedy with its proof; a remedy already
    given in full above (at ``given_above``) is named instead."""
    where = module_text(site.module_path, site.module_class)
    lines = [where]
    if site.fix_site is not None:
        lines.append(f"[magenta]NCHW-ordered data from {_producer_cell(site.fix_site, False)}[/]")
    if site.root_cause is not None:
        lines.append(f"[magenta]NCHW since {_producer_cell(site.root_cause, False)}[/]")
    if site.remedy is not None and given_above is not None:
        style = _REMEDY_STYLES[site.remedy.status]
        lines.append(f"[{style}]{escape(remedy_reference(given_above))}[/{style}]")
    elif site.remedy is not None:
        remedy = site.remedy
        style = _REMEDY_STYLES[remedy.status]
        lines.append(f"[{style}]{escape(remedy_head(remedy))}[/{style}]")
        held = next((t for t in remedy.evidence if t.holds), None)
        if held is not None:
            lines.append(f"[dim]proven: {escape(trial_figures(held, train))}[/dim]")
        elif remedy.evidence:
            tried = plural(len(remedy.evidence), "change")
            lines.append(f"[dim]{tried} tried, none held: see below[/dim]")
    elif site.extra:
        lines.append("[dim]no known remedy for this pattern[/dim]")
    return "\n".join(lines)


def cost_table(sites: tuple[CostSite, ...], *, train: bool, top: int = 12) -> Table:
    """The channels_last-only cost of ``sites`` (of a training step's audit with ``train``),
    by what fixes them (``group_sites``: the page's and the JSON's groups), the costliest
    first; groups under 1% of the cost each fold into one line."""
    groups = group_sites(sites)
    shown = [g for g in groups[:top] if g.share >= 0.01]
    table = Table(title="Where channels_last costs, against NCHW", show_lines=True, expand=True)
    table.add_column("op", style="bold", no_wrap=True)
    table.add_column("where; fix", overflow="fold", ratio=1)
    table.add_column("extra", justify="right", no_wrap=True)
    for group, given_above in zip(shown, remedies_given_above(shown, sites), strict=True):
        first = sites[group.sites[0]]
        where = _fix_cell(first, train, given_above)
        if len(group.sites) > 1:
            module = module_text(first.module_path, first.module_class)
            others = len(group.sites) - 1
            where = where.replace(module, f"{module} and {plural(others, 'more module')}", 1)
        cell = Group(CallSite(first.where), Wrapped(where))
        op = f"{first.op}\n[dim]{first.kind.value}, {first.phase.value}[/dim]"
        table.add_row(op, cell, f"{format_bytes(group.extra)}\n{group.share:.0%}")
    rest = groups[len(shown) :]
    if rest:
        extra = sum(g.extra for g in rest)
        count = sum(len(g.sites) for g in rest)
        table.add_row(
            f"{plural(len(rest), 'more group')}",
            f"{plural(count, 'site')}, each group under 1% of the cost, or beyond the top",
            format_bytes(extra),
        )
    return table


def trials_text(cost: Cost, train: bool) -> list[str]:
    """Every change tried (in a training step's what-ifs with ``train``), by the line it was
    made at."""
    lines: dict[str, list[str]] = {}
    for site in cost.sites:
        for trial in site.remedy.evidence if site.remedy is not None else ():
            tried, text = lines.setdefault(trial.line, []), trial_text(trial, train)
            if text not in tried:
                tried.append(text)
    return [
        text
        for line, tried in lines.items()
        for text in (f"changes tried at {line}:", *(f"  {t}" for t in tried))
    ]


def render_report(
    report: ModelReport, console: Console, show_all: bool = False, index: OpsIndex | None = None
) -> None:
    """The verdict and the cost by site; with ``show_all`` also the findings (offenders,
    parameter conversions, format-neutral losses) and the mixed-format operations. A report
    weighed by no cost shows its offenders. With ``index``, each operation that lost the format
    beside its rows of the operator index."""
    style = _VERDICT_STYLES[report.verdict]
    verdict = f"[{style}]{report.verdict.value}[/{style}]"
    console.print(Panel(summary_text(report), title=f"cl-audit: {verdict}", expand=False))
    cost = report.cost
    if cost is not None and cost.extra_bytes:
        train = report.environment.train
        console.print(cost_table(cost.sites, train=train))
        for line in trials_text(cost, train):  # wrapped at the terminal's width, indented alike
            indent = len(line) - len(line.lstrip())
            console.print(
                Padding(line.lstrip(), (0, 0, 0, indent + 2 * (indent > 0))), highlight=False
            )
    if cost is not None and cost.mixed:
        console.print(mixed_line(cost.mixed), highlight=False)
    if report.offenders and (cost is None or show_all):
        console.print(offenders_table(report.offenders))
    if show_all and report.parameter_conversions:
        title = "Conversions of parameter-derived data (not activations)"
        console.print(offenders_table(report.parameter_conversions, title))
    if show_all and report.format_neutral:
        title = "Format-neutral losses (the same copy happens in NCHW)"
        console.print(offenders_table(report.format_neutral, title))
    if index is not None:
        render_op_links(index, report_links(index, report), console)
    speed = report.speed
    if speed is not None and speed.known and speed.classes:
        console.print(speed_table(speed))
    if speed is not None and speed.compiled is not None and speed.compiled.classes:
        console.print(compiled_speed_table(speed.compiled))
        if speed.compiled.note:
            console.print(speed.compiled.note, highlight=False, style="dim")
    if speed is not None:
        for line in speed_lines(speed):
            console.print(line, highlight=False, style="dim")
    if report.compiled is not None:
        console.print(compiled_text(report.compiled))
    if report.ddp is not None:
        for line in ddp_lines(report.ddp):
            console.print(line, highlight=False, soft_wrap=True)
    if report.fsdp is not None:
        for line in fsdp_lines(report.fsdp):
            console.print(line, highlight=False, soft_wrap=True)
    if report.unwrapped:
        console.print(Group(*(Text(f"not wrapped: {u}", style="dim") for u in report.unwrapped)))
