"""Rich rendering of a model report: a summary panel and a table of offenders."""

from __future__ import annotations

from collections import Counter

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cl_audit.enums import (
    BucketMatch,
    DifferentialStatus,
    Evidence,
    Fate,
    RemedyStatus,
    TensorMode,
    Verdict,
)
from cl_audit.features.ops_index.ranking import report_links
from cl_audit.render import format_bytes
from cl_audit.render.ops_table import render_op_links
from cl_audit.report import (
    Comparison,
    Compiled,
    CompiledCopy,
    CompiledGraph,
    CompiledSite,
    Cost,
    CostSite,
    Finding,
    ModelReport,
    Producer,
    Remedy,
    SiteGroup,
    SweepReport,
    TensorSummary,
    Timing,
    Trial,
    by_call_site,
)
from cl_audit.report.distributed_report import DdpCheck, DdpRun, FsdpCheck, FsdpRun
from cl_audit.report.ops_report import OpsIndex

__all__ = [
    "compiled_text",
    "cost_line",
    "cost_table",
    "format_bytes",
    "offenders_table",
    "operator_examples",
    "predicted_note",
    "remedy_head",
    "remedy_lines",
    "render_comparison",
    "render_report",
    "render_sweep",
    "summary_text",
    "timing_line",
    "trial_text",
    "trials_text",
    "verify_text",
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


def _where(module_path: str | None, module_class: str | None) -> str:
    if module_path is None:
        return module_class or "?"
    return f"{module_path or '(root)'} ({module_class})"


def _producer_cell(producer: Producer | None, mixed: bool) -> str:
    if producer is None:
        return "mixed formats, producer unseen" if mixed else ""
    op = producer.python_op or producer.aten_op or "?"
    where = _where(producer.module_path, producer.module_class)
    return f"{op} in {where} at {producer.call_site or '?'}"


def _differential_line(report: ModelReport) -> str:
    run = report.differential
    if run.status is DifferentialStatus.RAN:
        line = "terminal losses compared with an NCHW run"
        return line + (f" ({run.unaligned} unaligned, counted as caused)" if run.unaligned else "")
    if run.status is DifferentialStatus.NOT_NEEDED:
        return "no terminal loss to compare with an NCHW run"
    return f"NCHW comparison {run.status.value}: {run.message}"


def cost_line(cost: Cost, train: bool) -> str:
    """The verdict's figures: "channels_last adds 48 MiB per forward (13%) at 9 sites; saves 0"."""
    unit = "training step" if train else "forward"
    sites = sum(1 for s in cost.sites if s.extra)
    saving = sum(1 for s in cost.sites if s.saved)
    gate = cost.gate
    return (
        f"channels_last adds {format_bytes(cost.extra_bytes)} per {unit} ({cost.share:.2%} of "
        f"{format_bytes(cost.bytes_written)} written) at {sites} site{'s' * (sites != 1)}; "
        f"saves {format_bytes(cost.saved_bytes)}"
        + (f" at {saving} site{'s' * (saving != 1)}" if saving else "")
        + f"; net {format_bytes(cost.net_bytes)}"
        + (" (the gate weighs what channels_last adds: a saving elsewhere removes no copy)"
           if cost.saved_bytes else "")
        + "\n"
        f"gate: {gate.share:.0%} and {format_bytes(gate.bytes)}{gate_batch_text(cost)}; copies "
        "inside kernels "
        + ("measured by the profiler" if cost.kernel_copies is Evidence.MEASURED
           else "predicted from strides and the kernels measured on this torch and device")
    )  # fmt: skip


def remedy_head(remedy: Remedy) -> str:
    """A remedy's advice in plain text and how far it is proven."""
    reference = f" ({remedy.reference})"
    if remedy.status is RemedyStatus.VERIFIED:
        return f"remedy, verified on this model: {remedy.advice}{reference}"
    if remedy.status is RemedyStatus.REFUTED:
        return f"no tried fix holds for {remedy.pattern}{reference}"
    note = f", {remedy.note}" if remedy.note else ""
    return f"remedy (a lead{note}): {remedy.advice}{reference}"


def remedy_lines(remedy: Remedy) -> list[str]:
    """``remedy_head``, then a line per change tried ("  held: ...", "  failed: ...")."""
    return [remedy_head(remedy), *(f"  {trial_text(trial)}" for trial in remedy.evidence)]


def trial_text(trial: Trial) -> str:
    """What one change did: "held: drop the .contiguous(): output max |diff| 0 (tolerance
    1e-05); here 2.3 MiB -> 0 B, elsewhere +0 B", or why it failed."""
    if trial.failure is not None:
        return f"failed: {trial.change}: {trial.failure}"
    return f"{'held' if trial.holds else 'failed'}: {trial.change}: {trial_figures(trial)}"


def trial_figures(trial: Trial) -> str:
    """A change's figures: the output's difference and the bytes at its sites and elsewhere."""
    moved = trial.moved_bytes or 0
    return (
        f"output max |diff| {trial.max_abs_diff or 0:.3g} (tolerance {trial.tolerance or 0:.3g});"
        f" here {format_bytes(trial.site_bytes_before)} -> "
        f"{format_bytes(trial.site_bytes_after or 0)}, elsewhere "
        f"{'+' if moved >= 0 else '-'}{format_bytes(abs(moved))}"
    )


def verify_text(cost: Cost) -> str | None:
    """ "remedies tried in what-if runs (4.9 s): 1 verified, 2 refuted", or None when none
    ran."""
    if cost.verify_seconds is None:
        return None
    counts = Counter(
        s.remedy.status for s in cost.sites if s.remedy is not None and s.remedy.evidence
    )
    found = ", ".join(f"{status.value} at {n} site{'s' * (n != 1)}" for status, n in counts.items())
    return f"remedies tried in what-if runs ({cost.verify_seconds:.1f} s): {found or 'none'}"


def gate_batch_text(cost: Cost) -> str:
    """Where the gate judged: " at batch 32 (projected from batch 2: 4.9 MiB of 151 MiB,
    3.24%)", or at the audited batch."""
    at = cost.at_gate
    if not at.projected:
        return "" if at.batch is None else f" at the audited batch {at.batch}"
    return (
        f" at batch {at.batch} (projected from batch {cost.batch}: adds "
        f"{format_bytes(at.extra_bytes)} of {format_bytes(at.bytes_written)}, {at.share:.2%})"
    )


_PREDICTED = {
    TensorMode.FAKE: ", fake tensors (predicted)",
    TensorMode.FAKE_STEP: ", predicted for {device}: fake tensors, the backward run node by node",
    TensorMode.REPLAYED: ", predicted for {device} from a traced step (replayed on fake tensors)",
}


def predicted_note(report: ModelReport) -> str:
    """How a predicted report was made (empty for an eager one)."""
    env = report.environment
    return _PREDICTED.get(env.mode, "").format(device=env.device)


def summary_text(report: ModelReport) -> Text:
    s, env = report.summary, report.environment
    amp = f", autocast {env.autocast}" if env.autocast else ""
    mode = predicted_note(report)
    lines = [
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
        f"{s.calls_checked} calls checked, {s.distinct_ops} distinct ops",
        f"{s.losses} losses at {len(by_call_site(report.offenders))} call sites "
        f"({s.offending_ops} distinct ops): "
        f"{s.round_trips} round trips, {s.terminal_conversions} terminal; {s.regains} regains; "
        f"{format_bytes(s.bytes_converted)} converted",
        f"not offenders: {s.parameter_conversions} parameter conversions "
        f"({format_bytes(s.parameter_bytes)}), {s.format_neutral} format-neutral losses "
        f"({format_bytes(s.format_neutral_bytes)})",
    ]
    if report.cost is not None and report.differential.unaligned:
        lines.append(_differential_line(report))
    if report.timing is not None:
        lines.append(timing_line(report.timing))
    return Text("\n".join(lines))


def timing_line(timing: Timing) -> str:
    """``--time``: the step and what the flagged operations take of it."""
    rounds = len(timing.rounds_ms)
    return (
        f"step {timing.step_ms:.1f} ms (median of {rounds}, {timing.threads} threads); losses "
        f"{timing.losses_ms:.2f} ms = {timing.share:.1%} of it (offenders {timing.offenders_ms:.2f}"
        f", parameter {timing.parameter_ms:.2f}); regaining operations, whole, "
        f"{timing.regains_ms:.2f} ms = {timing.regain_share:.1%} ({timing.clock} profiler)"
    )


def _modules_cell(group: SiteGroup) -> str:
    first = group.first
    where = _where(group.module_paths[0], first.module_class)
    others = len(group.module_paths) - 1
    return where + (f" and {others} more module{'s' * (others > 1)}" if others else "")


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
        trips = f"{group.round_trips} round trip{'s' * (group.round_trips > 1)}"
        kinds = [trips] * bool(group.round_trips) + [f"{group.terminal} terminal"] * bool(
            group.terminal
        )
        if group.terminal and f.differential:
            kinds.append(f"({f.differential.value})")
        kinds.append(format_bytes(group.bytes_converted))
        if group.time_ms is not None:
            kinds.append(f"{group.time_ms:.2f} ms")
        cell = Group(CallSite(f.call_site or "?"), Text.from_markup(where, overflow="fold"))
        table.add_row(op, cell, "\n".join([str(group.count), *kinds]))
    return table


_VERDICT_STYLES = {Verdict.OFFENDING: "red", Verdict.MINOR: "yellow", Verdict.CLEAN: "green"}


_REMEDY_STYLES = {
    RemedyStatus.VERIFIED: "green",
    RemedyStatus.LEAD: "cyan",
    RemedyStatus.REFUTED: "yellow",
}


def _fix_cell(site: CostSite) -> str:
    where = _where(site.module_path, site.module_class)
    lines = [where]
    if site.fix_site is not None:
        lines.append(f"[magenta]NCHW-ordered data from {_producer_cell(site.fix_site, False)}[/]")
    if site.root_cause is not None:
        lines.append(f"[magenta]NCHW since {_producer_cell(site.root_cause, False)}[/]")
    if site.remedy is not None:
        remedy = site.remedy
        style = _REMEDY_STYLES[remedy.status]
        lines.append(f"[{style}]{escape(remedy_head(remedy))}[/{style}]")
        held = next((t for t in remedy.evidence if t.holds), None)
        if held is not None:
            lines.append(f"[dim]proven: {escape(trial_figures(held))}[/dim]")
        elif remedy.evidence:
            lines.append(f"[dim]{len(remedy.evidence)} changes tried, none held: see below[/dim]")
    elif site.extra:
        lines.append("[dim]no known remedy for this pattern[/dim]")
    return "\n".join(lines)


def cost_table(sites: tuple[CostSite, ...], top: int = 12) -> Table:
    """The channels_last-only cost of ``sites``, the costliest first, folded over the modules
    a site ran in; sites under 1% of the cost each fold into one line."""
    total = sum(site.extra for site in sites)
    groups: dict[tuple[object, ...], list[CostSite]] = {}
    for site in sites:
        if site.extra:
            key = (site.kind, site.phase, site.op, site.call_site, site.fix_site,
                   site.root_cause, site.remedy)  # fmt: skip
            groups.setdefault(key, []).append(site)
    folded = sorted(groups.values(), key=lambda g: -sum(s.extra for s in g))
    shown = [g for g in folded[:top] if sum(s.extra for s in g) * 100 >= total]
    table = Table(title="Where channels_last costs, against NCHW", show_lines=True, expand=True)
    table.add_column("op", style="bold", no_wrap=True)
    table.add_column("where; fix", overflow="fold", ratio=1)
    table.add_column("extra", justify="right", no_wrap=True)
    for group in shown:
        first = group[0]
        modules = len(group)
        where = _fix_cell(first)
        if modules > 1:
            where = where.replace(
                _where(first.module_path, first.module_class),
                _where(first.module_path, first.module_class) + f" and {modules - 1} more",
                1,
            )
        cell = Group(CallSite(first.where), Text.from_markup(where, overflow="fold"))
        op = f"{first.op}\n[dim]{first.kind.value}, {first.phase.value}[/dim]"
        extra = sum(s.extra for s in group)
        table.add_row(op, cell, f"{format_bytes(extra)}\n{extra / total:.0%}")
    rest = folded[len(shown) :]
    if rest:
        extra = sum(s.extra for g in rest for s in g)
        table.add_row(
            f"{len(rest)} more sites",
            "each under 1% of the cost, or beyond the top",
            format_bytes(extra),
        )
    return table


def trials_text(cost: Cost) -> list[str]:
    """Every change tried, by the line it was made at."""
    lines: dict[str, list[str]] = {}
    for site in cost.sites:
        for trial in site.remedy.evidence if site.remedy is not None else ():
            tried, text = lines.setdefault(trial.line, []), trial_text(trial)
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
        console.print(cost_table(cost.sites))
        for line in trials_text(cost):
            console.print(line, highlight=False, soft_wrap=True)
    if cost is not None and cost.mixed:
        reads = sum(m.bytes_read for m in cost.mixed)
        console.print(
            f"{len(cost.mixed)} elementwise operations read both orders ({format_bytes(reads)} "
            "read strided; no copy, not counted in the cost)"
        )
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


def ddp_run_line(run: DdpRun) -> str:
    """One DDP configuration in a line: its parameters against the buckets, and DDP's word."""
    counts = (
        ", ".join(f"{run.count(m)} {m.value}" for m in BucketMatch if run.count(m))
        or "no 4-D or 5-D parameter"
    )
    said = f"; DDP warns: {run.warning[:60]}" if run.warning else "; no warning"
    return (
        f"converted {run.order.value} wrapping, gradient_as_bucket_view={run.bucket_view}: "
        f"{counts}; {format_bytes(run.copied)} copied in the step{said}"
    )


def ddp_lines(check: DdpCheck, top: int = 5) -> list[str]:
    """The step under DDP: each configuration, the parameters whose buckets mismatch where the
    model is converted after wrapping, the ambiguous ones, and the advice."""
    agree = "" if check.ranks_agree else " (the ranks disagree: rank 0's shown)"
    lines = [f"Under DDP ({check.backend}, {check.world_size} processes){agree}:"]
    lines += ["  " + ddp_run_line(run) for run in check.runs]
    for run in check.runs:
        odd = [p for p in run.parameters if p.match is not BucketMatch.MATCHES]
        for p in odd[:top]:
            lines.append(
                f"  {run.order.value}, bucket view {run.bucket_view}: {p.name} {p.shape} "
                f"strides {p.strides}, bucket {p.bucket_strides}, grad {p.grad_strides}: "
                f"{p.match.value}"
                + (
                    " (size-1 dims: DDP compares them, autograd's layout contract does not)"
                    if p.match is BucketMatch.AMBIGUOUS
                    else ""
                )
            )
        if len(odd) > top:
            lines.append(f"  ... and {len(odd) - top} more")
    if check.advice:
        lines.append(f"  remedy: {check.advice}")
    return lines


def fsdp_run_line(run: FsdpRun, top: int = 4) -> str:
    """One FSDP wrapping in a line: what FSDP2 refused, or what FSDP1 handed back."""
    if run.api == "fsdp2":
        head = "FSDP2 (fully_shard)"
        if run.error:
            return f"{head}: {run.error}"
        if not run.refused:
            return f"{head}: takes every parameter"
        names = ", ".join(run.refused[:top]) + (" ..." if len(run.refused) > top else "")
        return (
            f"{head}: refuses {len(run.refused)} of {len(run.parameters)} 4-D/5-D parameters "
            f"({names}): {run.message}; wraps once they are made contiguous"
        )
    head = f"FSDP1 (use_orig_params={run.use_orig_params})"
    if run.error:
        return f"{head}: {run.error}"
    lost = [p.name for p in run.parameters if p.kept is False]
    kept = sum(p.kept is True for p in run.parameters)
    text = f"{head}: {kept} of {len(run.parameters)} parameters come back channels_last"
    if lost:
        text += f"; {len(lost)} come back in another order ({', '.join(lost[:top])})"
    return text + " after unflattening"


def fsdp_lines(check: FsdpCheck) -> list[str]:
    """The FSDP pre-flight: a line per wrapping."""
    lines = [f"FSDP pre-flight ({check.backend}, {check.world_size} processes):"]
    return lines + ["  " + fsdp_run_line(run) for run in check.runs]


def compiled_text(compiled: Compiled, top: int = 3) -> Text:
    """Inductor's layout decision for each compiled graph, why, and the convolutions that
    decided it (the first ``top`` of each graph)."""
    text = Text(
        f"torch.compile (torch {compiled.torch}): {compiled.basis}; "
        f"{len(compiled.graphs)} graph(s) captured and lowered in {compiled.seconds:.1f} s\n",
        style="bold",
    )
    for graph in compiled.graphs:
        state = "ON" if graph.layout_optimization else "OFF"
        text.append(f"  graph {graph.index} ({graph.label}, {graph.nodes} nodes): layout ")
        text.append("optimisation ")
        text.append(state, style="green" if graph.layout_optimization else "red")
        text.append(f": {graph.reason}")
        if graph.forced is not None:
            text.append(f"; forced: {'ON' if graph.forced else 'OFF'}")
        text.append("\n")
        deciding = graph.deciding
        for conv in deciding[:top]:
            kernel = "x".join(map(str, conv.kernel))
            where = _where(conv.module_path, conv.module_class)
            text.append(
                f"    {conv.kind.value} convolution at {conv.call_site or '?'} {where}: "
                f"{conv.in_per_group} input channels per group x {conv.groups} groups -> "
                f"{conv.out_channels}, {kernel} kernel, {conv.flop_share:.1%} of the flops\n",
                style="dim",
            )
        if len(deciding) > top:
            text.append(f"    and {len(deciding) - top} more (--json lists them)\n", style="dim")
        _copies_text(text, graph, top)
    if compiled.sites is not None:
        _sites_text(text, compiled.sites, top)
    return text


def _copies_text(text: Text, graph: CompiledGraph, top: int) -> None:
    """The layout copies a graph's lowering inserts, grouped by site, the largest first."""
    if graph.conversions is None:
        text.append(f"    lowering: {graph.lowering_error}\n", style="yellow")
        return
    line = f"    lowering: {_copies(graph.conversions)}"
    if graph.forced_conversions is not None and graph.forced != graph.layout_optimization:
        line += f"; forced: {_copies(graph.forced_conversions)}"
    text.append(line + "\n")
    groups: dict[tuple[object, ...], list[CompiledCopy]] = {}
    for c in graph.conversions:
        groups.setdefault((c.call_site, c.consumer, c.consumer_site, c.kind), []).append(c)
    ranked = sorted(groups.values(), key=lambda g: -sum(c.bytes for c in g))
    for group in ranked[:top]:
        c = group[0]
        where = f" ({c.module_path})" if c.module_path else ""
        made = (
            "a graph input"
            if c.producer is None
            else f"{_op(c.producer)} at {c.call_site or '?'}{where}"
        )
        text.append(
            f"      {len(group)} x {c.kind.value} ({format_bytes(sum(x.bytes for x in group))}) "
            f"for {_op(c.consumer)} at {c.consumer_site or '?'}, of {made}\n",
            style="dim",
        )
    if len(ranked) > top:
        text.append(f"      and {len(ranked) - top} more sites (--json lists them)\n", style="dim")


def _copies(copies: tuple[CompiledCopy, ...]) -> str:
    if not copies:
        return "no layout copy"
    noun = "layout copy" if len(copies) == 1 else "layout copies"
    return f"{len(copies)} {noun}, {format_bytes(sum(c.bytes for c in copies))}"


def _op(name: str) -> str:
    """An aten operation's short name: ``aten.convolution.default`` -> ``convolution``."""
    return name.removeprefix("aten.").removesuffix(".default")


def _sites_text(text: Text, sites: tuple[CompiledSite, ...], top: int) -> None:
    """The eager audit's losses beside the compiled graphs' copies, per call site."""
    counts = {fate: sum(s.fate is fate for s in sites) for fate in Fate}
    text.append(
        f"  beside the eager audit (sites): {counts[Fate.REMOVED]} eager loss site(s) removed, "
        f"{counts[Fate.KEPT]} kept, {counts[Fate.ADDED]} added by the compiled graphs\n"
    )
    for site in [s for s in sites if s.fate is not Fate.REMOVED][:top] + [
        s for s in sites if s.fate is Fate.REMOVED
    ][:top]:
        eager = (
            f"eager: {site.eager_losses} loss(es), {format_bytes(site.eager_bytes)}"
            if site.eager_losses
            else "no eager loss"
        )
        compiled = (
            f"compiled: {site.compiled_copies} copy(ies), {format_bytes(site.compiled_bytes)}"
            if site.compiled_copies
            else "no compiled copy"
        )
        text.append(
            f"    {site.fate.value:<8}{site.call_site or '?'}: {eager}; {compiled}\n",
            style="red" if site.fate is Fate.ADDED else "dim",
        )


def operator_examples(report: SweepReport, per_op: int = 5) -> dict[str, tuple[str, ...]]:
    """Places ("model:module.path") for each operator of the coverage: its offender examples,
    then its cost sites (a training sweep's kernel copies are cost sites with no offender)."""
    places = {cov.op: list(cov.examples) for cov in report.operators}
    for row in report.models:
        costliest: dict[str, CostSite] = {}  # one place per model: its costliest site at the op
        for site in row.cost.sites if row.cost is not None and row.offending else ():
            op = site.aten_op or site.op
            if site.extra > (costliest[op].extra if op in costliest else 0):
                costliest[op] = site
        for op, site in costliest.items():
            known = places.setdefault(op, [])
            if len(known) < per_op and not any(p.startswith(f"{row.name}:") for p in known):
                known.append(f"{row.name}:{site.module_path}")
    return {op: tuple(found) for op, found in places.items()}


def render_sweep(report: SweepReport, console: Console, top: int = 10) -> None:
    """The sweep summary, the worst operators, and the models that failed."""
    s = report.summary
    env = report.environment
    text = Text(
        f"{s.models} models: {s.offending} offending, {s.minor} minor, {s.clean} clean, "
        f"{s.failed} failed, "
        f"{s.skipped} skipped  ({env.device} {env.dtype}, {env.mode.value} mode, "
        f"engine {env.engine.value})"
    )
    if s.cached:
        text.append(f"\n{s.cached} of them reused from the cache, {s.models - s.cached} audited")
    console.print(Panel(text, title="cl-audit sweep", expand=False))
    costly = [cov for cov in report.operators if cov.extra_bytes or cov.models]
    if costly:
        table = Table(
            title=f"Operations by channels_last-only cost (of {len(costly)})", expand=True
        )
        table.add_column("op", style="bold", no_wrap=True)
        table.add_column("extra", justify="right", no_wrap=True)
        table.add_column("models\ncost/offender", justify="right", no_wrap=True)
        table.add_column("offender\nevents", justify="right", no_wrap=True)
        table.add_column("for example", overflow="fold")
        examples = operator_examples(report)
        for cov in costly[:top]:
            more = len(cov.python_ops) - 2
            name = "\n".join((cov.op, *cov.python_ops[:2], *[f"+{more} more"] * (more > 0)))
            models = list(dict.fromkeys(e.split(":", 1)[0] for e in examples.get(cov.op, ())))
            table.add_row(
                name,
                format_bytes(cov.extra_bytes),
                f"{cov.cost_models} / {cov.models}",
                str(cov.events),
                "\n".join(models[:3]),
            )
        console.print(table)
    parameter = sum(1 for r in report.models if r.parameter_conversions)
    neutral = sum(1 for r in report.models if r.format_neutral)
    console.print(
        f"{parameter} models convert parameter-derived data, {neutral} have format-neutral "
        "losses (not offenders; see the JSON report)"
    )
    failed = [r for r in report.models if r.status.failed]
    for row in failed[:top]:
        console.print(
            f"[red]{row.status.value}[/red] {row.key} "
            f"({row.stage.value if row.stage else '?'}): {row.message}",
            highlight=False,
        )
    if len(failed) > top:
        console.print(f"... and {len(failed) - top} more failed models (see the JSON report)")


def render_comparison(comparison: Comparison, console: Console) -> None:
    for label, items, style in (
        ("new offence", [f"{k} {op}" for k, op in comparison.new_offences], "red"),
        ("new failure", list(comparison.new_failures), "red"),
        ("cost grew past the gate", list(comparison.grown_costs), "red"),
        ("fixed", [f"{k} {op}" for k, op in comparison.fixed_offences], "green"),
        ("no longer failing", list(comparison.fixed_failures), "green"),
    ):
        for item in items:
            console.print(f"[{style}]{label}:[/{style}] {item}", highlight=False)
    if not comparison.regressed:
        console.print("[green]no new offences or failures against the baseline[/green]")
