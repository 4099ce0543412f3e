"""The cost section of the HTML report: the verdict's figures, then the cost sites by what fixes
them (``Cost.groups``, the terminal's and the JSON's groups), each group's remedy and proof once,
its members folded."""

from __future__ import annotations

from cl_audit.render.html_page import breakable, esc
from cl_audit.render.wording import (
    cost_line,
    format_bytes,
    module_text,
    plural,
    remedies_given_above,
    remedy_lines,
    remedy_reference,
    verify_text,
)
from cl_audit.report import Cost, CostGroup, CostSite, ModelReport, Producer, Remedy

__all__ = ["cost_section"]


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


def _remedy_cell(remedy: Remedy, train: bool) -> str:
    """The remedy and how far it is proven; the changes tried (in a training step with
    ``train``), under a fold."""
    head, *trials = remedy_lines(remedy, train)
    cell = f'<span class="remedy-{esc(remedy.status.value)}">{esc(head)}</span>'
    if trials:
        items = "".join(f"<li>{esc(trial.strip())}</li>" for trial in trials)
        cell += f"<details><summary>changes tried</summary><ul>{items}</ul></details>"
    return cell


def _module(site: CostSite) -> str:
    return esc(module_text(site.module_path, site.module_class))


def _strides(site: CostSite) -> str:
    if site.strides is None:
        return ""
    source, output = site.strides
    return f' <span class="dim">{esc(source)} &rarr; {esc(output)}</span>'


def _members(group: CostGroup, sites: tuple[CostSite, ...]) -> str:
    """A group's first member, and the others folded: each one's module, bytes and strides
    (its first call's, in and out)."""
    first = sites[group.sites[0]]
    if len(group.sites) == 1:
        return _module(first) + _strides(first)
    rows = "".join(
        f"<li>{_module(sites[p])}: {format_bytes(sites[p].extra)}{_strides(sites[p])}</li>"
        for p in group.sites
    )
    label = f"{_module(first)} and {plural(len(group.sites) - 1, 'more module')}"
    return f'<details class="members"><summary>{label}</summary><ol>{rows}</ol></details>'


def _group_row(group: CostGroup, cost: Cost, train: bool, given_above: str | None) -> str:
    """A group's row; a remedy already given in full above (at ``given_above``) is named, not
    repeated."""
    first = cost.sites[group.sites[0]]
    remedy = first.remedy
    if remedy is None:
        cell = '<span class="dim">no known remedy</span>'
    elif given_above is not None:
        style = f"remedy-{esc(remedy.status.value)}"
        cell = f'<span class="{style}">{breakable(remedy_reference(given_above))}</span>'
    else:
        cell = _remedy_cell(remedy, train)
    return (
        f'<tr><td><code class="op">{esc(group.op)}</code><br><span class="dim">'
        f"{esc(group.kind.value)}, {esc(group.phase.value)}</span></td>"
        f'<td><code class="site">{breakable(first.where)}</code></td>'
        f'<td data-value="{len(group.sites)}">{_members(group, cost.sites)}</td>'
        f'<td class="num" data-value="{group.extra}">{format_bytes(group.extra)}</td>'
        f'<td class="num" data-value="{group.share}">{group.share:.1%}</td>'
        f"<td>{breakable(_fix_text(first))}</td><td>{cell}</td></tr>"
    )


def _saved_rows(cost: Cost) -> str:
    """The sites where NCHW copies more than channels_last: nothing to fix there."""
    saved = [s for s in cost.sites if s.saved]
    if not saved:
        return ""
    rows = "".join(
        f'<tr><td><code class="op">{esc(s.op)}</code></td>'
        f'<td><code class="site">{breakable(s.where)}</code></td><td>{_module(s)}</td>'
        f'<td class="num" data-value="{s.saved}">{format_bytes(s.saved)}</td></tr>'
        for s in saved
    )
    return (
        f"<details><summary><b>Where NCHW copies more</b> ({plural(len(saved), 'site')}: "
        "bytes channels_last saves)</summary>"
        '<table class="sortable" id="saved"><thead><tr><th>op</th><th>call site</th>'
        '<th>module</th><th class="num">saved</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></details>"
    )


def _mixed(cost: Cost) -> str:
    if not cost.mixed:
        return ""
    rows = "".join(
        f'<tr><td><code class="op">{esc(m.op)}</code></td><td><code class="site">'
        f"{breakable(m.call_site or '?')}</code></td><td>{esc(m.module_path or '(root)')}</td>"
        f'<td class="num">{m.count}</td><td class="num">{format_bytes(m.bytes_read)}</td></tr>'
        for m in cost.mixed
    )
    return (
        "<details><summary><b>Elementwise operations reading both orders</b> "
        f"({len(cost.mixed)}: strided reads, no copy, not in the cost)</summary>"
        '<table class="sortable" id="mixed"><thead><tr><th>op</th><th>call site</th>'
        '<th>module</th><th class="num">count</th><th class="num">read strided</th></tr>'
        f"</thead><tbody>{rows}</tbody></table></details>"
    )


def cost_section(report: ModelReport) -> str:
    """The verdict's figures, then the cost by what fixes it, the costliest group first."""
    cost = report.cost
    if cost is None:
        return (
            f'<p class="dim">Cost not weighed ({esc(report.differential.status.value)}'
            f"{': ' + esc(report.differential.message) if report.differential.message else ''})"
            "; the verdict counts offenders.</p>"
        )
    train = report.environment.train
    lines = cost_line(cost, train).split("\n")
    tried = verify_text(cost)
    groups = cost.groups
    above = remedies_given_above(groups, cost.sites)
    rows = "".join(_group_row(g, cost, train, a) for g, a in zip(groups, above, strict=True))
    members = sum(len(g.sites) for g in groups)
    return (
        f'<p><b>{esc(lines[0])}</b><br><span class="dim">{esc(lines[1])}</span>'
        + (f'<br><span class="dim">{esc(tried)}</span>' if tried else "")
        + "</p>"
        + f'<p class="dim">{plural(members, "site")} channels_last pays for, in '
        f"{plural(len(groups), 'group')} by what fixes them: one operation at one line in "
        "modules of one class, one fix site's pattern, one remedy.</p>"
        '<table class="sortable" id="cost"><thead><tr><th>op</th><th>call site</th>'
        '<th>modules</th><th class="num">channels_last only</th><th class="num">share</th>'
        "<th>NCHW-ordered data from (fix site)</th><th>remedy</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>" + _saved_rows(cost) + _mixed(cost)
    )
