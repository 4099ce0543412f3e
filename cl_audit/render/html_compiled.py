"""The HTML of ``--compile``'s section: Inductor's layout decision per graph and why, the
layout copies its lowering inserts, and the compiled copies beside the eager losses."""

from __future__ import annotations

from cl_audit.render.html_page import esc
from cl_audit.render.wording import (
    format_bytes,
)
from cl_audit.report import Compiled, CompiledGraph

__all__ = ["compiled_section"]


def compiled_section(compiled: Compiled) -> str:
    """Inductor's layout decision for each compiled graph, why, and its convolutions (the
    deciding ones first)."""
    graphs = []
    for graph in compiled.graphs:
        state = "ON" if graph.layout_optimization else "OFF"
        style = "verdict-good" if graph.layout_optimization else "verdict-bad"
        forced = "" if graph.forced is None else f"; forced: {'ON' if graph.forced else 'OFF'}"
        convs = sorted(graph.convolutions, key=lambda c: (not c.deciding, -c.flop_share))
        rows = "".join(
            f"<tr><td>{'deciding' if c.deciding else ''}</td>"
            f'<td><code class="site">{esc(c.call_site or "?")}</code></td>'
            f"<td>{esc(c.module_path or '?')}</td><td>{esc(c.kind.value)}</td>"
            f'<td class="num">{c.in_per_group}</td><td class="num">{c.groups}</td>'
            f'<td class="num">{c.out_channels}</td><td>{esc("x".join(map(str, c.kernel)))}</td>'
            f'<td class="num" data-value="{c.flop_share}">{c.flop_share:.1%}</td></tr>'
            for c in convs
        )
        graphs.append(
            f"<p><b>graph {graph.index} ({esc(graph.label)}, {graph.nodes} nodes): layout "
            f'optimisation <span class="{style}">{state}</span></b>: '
            f"{esc(graph.reason)}{esc(forced)}</p>"
            + (
                f"<details{' open' if graph.deciding else ''}><summary>{len(convs)} "
                "convolutions</summary>"
                f'<table class="sortable" id="compiled-{graph.index}"><thead><tr><th></th>'
                '<th>call site</th><th>module</th><th>class</th><th class="num">in per '
                'group</th><th class="num">groups</th><th class="num">out</th><th>kernel</th>'
                f'<th class="num">flops</th></tr></thead><tbody>{rows}</tbody></table></details>'
                if convs
                else ""
            )
            + _copies_html(graph)
        )
    return (
        f'<p class="dim">torch {esc(compiled.torch)}: {esc(compiled.basis)}; '
        f"{len(compiled.graphs)} graph(s) captured and lowered in {compiled.seconds:.1f} s</p>"
        + "".join(graphs)
        + _sites_html(compiled)
    )


def _copies_html(graph: CompiledGraph) -> str:
    """The layout copies a graph's lowering inserts (and under the forced decision)."""
    if graph.conversions is None:
        return f'<p class="dim">lowering: {esc(graph.lowering_error or "")}</p>'
    total = sum(c.bytes for c in graph.conversions)
    forced = ""
    if graph.forced_conversions is not None and graph.forced != graph.layout_optimization:
        forced_total = sum(c.bytes for c in graph.forced_conversions)
        forced = f"; forced: {len(graph.forced_conversions)} ({format_bytes(forced_total)})"
    rows = "".join(
        f'<tr><td><code class="site">{esc(c.call_site or "?")}</code></td>'
        f"<td>{esc(c.module_path or '?')}</td><td>{esc(c.producer or 'graph input')}</td>"
        f"<td>{esc(c.consumer)}</td>"
        f'<td><code class="site">{esc(c.consumer_site or "?")}</code></td>'
        f"<td>{esc(c.kind.value)}</td><td>{esc(str(list(c.shape)))}</td>"
        f'<td class="num" data-value="{c.bytes}">{format_bytes(c.bytes)}</td></tr>'
        for c in graph.conversions
    )
    return (
        f"<details><summary>lowering: {len(graph.conversions)} layout copies "
        f"({format_bytes(total)}){esc(forced)}</summary>"
        f'<table class="sortable" id="compiled-copies-{graph.index}"><thead><tr>'
        "<th>data made at</th><th>module</th><th>made by</th><th>copied for</th>"
        '<th>at</th><th>kind</th><th>shape</th><th class="num">bytes</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></details>"
        if graph.conversions
        else f'<p class="dim">lowering: no layout copy{esc(forced)}</p>'
    )


def _sites_html(compiled: Compiled) -> str:
    """The eager audit's losses beside the compiled graphs' copies, per call site."""
    if compiled.sites is None:
        return ""
    rows = "".join(
        f"<tr><td>{esc(s.fate.value)}</td>"
        f'<td><code class="site">{esc(s.call_site or "?")}</code></td>'
        f"<td>{esc(s.module_path or '?')}</td>"
        f'<td class="num">{s.eager_losses}</td>'
        f'<td class="num" data-value="{s.eager_bytes}">{format_bytes(s.eager_bytes)}</td>'
        f'<td class="num">{s.compiled_copies}</td>'
        f'<td class="num" data-value="{s.compiled_bytes}">{format_bytes(s.compiled_bytes)}</td>'
        "</tr>"
        for s in compiled.sites
    )
    return (
        "<p><b>Beside the eager audit</b>: which eager losses the compiled graphs remove, keep "
        "or add, per call site</p>"
        '<table class="sortable" id="compiled-sites"><thead><tr><th>fate</th><th>call site</th>'
        '<th>module</th><th class="num">eager losses</th><th class="num">eager bytes</th>'
        '<th class="num">compiled copies</th><th class="num">compiled bytes</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
        if compiled.sites
        else '<p class="dim">Beside the eager audit: no losses and no compiled copies.</p>'
    )
