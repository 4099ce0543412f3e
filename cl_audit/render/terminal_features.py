"""The terminal sections of the features an audit may add: distributed runs' checks and
``--compile``'s graphs."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from cl_audit.enums import (
    BucketMatch,
    Fate,
)
from cl_audit.render.wording import (
    compiled_rows,
    ddp_run_line,
    format_bytes,
    fsdp_run_line,
    module_text,
)
from cl_audit.report import (
    Compiled,
    CompiledCopy,
    CompiledGraph,
    CompiledSite,
)
from cl_audit.report.compiled_speed import CompiledSpeed
from cl_audit.report.distributed_report import DdpCheck, FsdpCheck
from cl_audit.report.speed_report import Speed

__all__ = ["compiled_speed_table", "compiled_text", "ddp_lines", "fsdp_lines", "speed_table"]


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
            where = module_text(conv.module_path, conv.module_class)
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


def speed_table(speed: Speed) -> Table:
    """The step's time by operation class in each layout (milliseconds), and the totals."""
    basis = speed.basis.value if speed.basis else "unknown"
    table = Table(title=f"Time by operation class, {basis} ({speed.device})", title_justify="left")
    table.add_column("class", overflow="fold")
    table.add_column("channels_last", justify="right")
    table.add_column("NCHW", justify="right")
    table.add_column("speedup", justify="right")
    for r in speed.rows():
        ratio = f"{r.speedup:.2f}x" if r.speedup is not None else "-"
        style = "bold" if r.total else None
        table.add_row(r.label, f"{r.channels_last_ms:.2f} ms", f"{r.nchw_ms:.2f} ms", ratio,
                      style=style)  # fmt: skip
    return table


def compiled_speed_table(compiled: CompiledSpeed) -> Table:
    """The compiled step's time by class in each layout and what compiling each did
    (``compiled_rows``)."""
    title = f"Compiled step by class, measured ({compiled.options.described})"
    table = Table(title=title, title_justify="left")
    table.add_column("", overflow="fold")
    table.add_column("channels_last", justify="right")
    table.add_column("NCHW", justify="right")
    for label, cl, nchw in compiled_rows(compiled):
        table.add_row(label, cl, nchw, style="bold" if label.startswith("step") else None)
    return table
