"""Rich rendering of the operator coverage index (``cl-audit ops``): a head with the counts,
then one row per operator, worst first."""

from __future__ import annotations

import fnmatch

from rich.console import Console
from rich.table import Table

from cl_audit.enums import OpBehaviour
from cl_audit.features.ops_index.diff import OpChange
from cl_audit.features.ops_index.ranking import OpCost, OpLink
from cl_audit.render.wording import format_bytes
from cl_audit.report.ops_report import OperatorRow, OpsIndex, SampleResult

__all__ = [
    "render_op_costs",
    "render_op_links",
    "render_ops",
    "render_ops_diff",
    "render_unjudged",
]

_ORDER = {b: i for i, b in enumerate(OpBehaviour)}


def render_ops(index: OpsIndex, rows: tuple[OperatorRow, ...], console: Console) -> None:
    counts = ", ".join(f"{b.value} {index.count(b)}" for b in OpBehaviour if index.count(b))
    failed = sum(row.error is not None for row in index.rows)
    console.print(
        f"torch {index.torch}, {index.device} {index.dtype}, "
        f"{'predicted on fake tensors (no kernel ran)' if index.predicted else 'eager'}: "
        f"{len(index.rows)} operators "
        f"judged ({counts}"
        + (f"; {failed} whose samples could not be made" if failed else "")
        + f"); {index.without_map} that take no 4-D input (--json lists why); "
        f"{index.seconds:.1f} s",
        highlight=False,
    )
    if index.gradients_not_judged:
        console.print(f"note: {index.gradients_not_judged}", highlight=False)
    if not rows:
        return
    table = Table(expand=True, show_lines=False)
    table.add_column("operator", style="bold", overflow="fold", ratio=3)
    table.add_column("forward", no_wrap=True)
    table.add_column("gradient", no_wrap=True)
    table.add_column("samples", overflow="fold", ratio=2)
    table.add_column("example: input -> output strides", overflow="fold", ratio=3)
    for row in sorted(rows, key=lambda r: (_ORDER.get(r.behaviour, -1), r.op)):
        table.add_row(
            row.op,
            row.behaviour.value if row.behaviour else "error",
            _word(row.gradient),
            ", ".join(f"{b.value} {n}" for b, n in row.counts),
            _example(row),
        )
    console.print(table)
    console.print(f"{len(rows)} of {len(index.rows)} operators shown", highlight=False)
    if len(rows) <= CASES_SHOWN:
        for row in rows:
            _render_cases(row, console)


CASES_SHOWN = 8  # at most this many rows shown: each one's cases too


def render_unjudged(index: OpsIndex, patterns: tuple[str, ...], console: Console) -> None:
    """The operators matching ``patterns`` that have no row, each with why."""
    for item in index.unjudged:
        if any(fnmatch.fnmatchcase(item.op, p) for p in patterns):
            console.print(f"{item.op}: not judged, {item.reason}", highlight=False)


def _render_cases(row: OperatorRow, console: Console) -> None:
    """Each case ``row`` was judged in: the database's samples, raised to 4-D, per dimension,
    the mixed layouts (whose behaviour says the output's layout)."""
    if not row.cases:
        return
    table = Table(title=f"{row.op}: by case", expand=False, title_justify="left")
    table.add_column("case", style="bold", no_wrap=True)
    table.add_column("output", no_wrap=True)
    table.add_column("samples", overflow="fold")
    table.add_column("example: input -> output strides", overflow="fold")
    for case in row.cases:
        mixed = case.mixed
        word = _LAYOUT.get(case.behaviour, case.behaviour.value) if mixed else case.behaviour.value
        counts = ", ".join(f"{b.value} {n}" for b, n in case.counts)
        table.add_row(case.case, word, counts, _sample(case.example))
    console.print(table)


# What a mixed case's behaviour says of its output.
_LAYOUT = {OpBehaviour.KEEPS: "channels_last", OpBehaviour.LOSES: "NCHW"}


def _example(row: OperatorRow) -> str:
    if row.error is not None:
        return row.error
    return "" if row.example is None else _sample(row.example)


def _sample(e: SampleResult) -> str:
    text = f"{tuple(e.input_shape)} {tuple(e.input_strides)}"
    if e.output_strides is not None:
        text += f" -> {tuple(e.output_shape or ())} {tuple(e.output_strides)}"
    return text + (f" ({e.note})" if e.note else "")


def render_ops_diff(
    old: OpsIndex, new: OpsIndex, changes: tuple[OpChange, ...], console: Console
) -> None:
    """What moved between two indexes: forward behaviours, then gradients; in each, worse
    first, then better, then those on one side only (the database gained or dropped an
    operator's 4-D samples, they failed there, or a gradient was judged on one side only)."""
    forward = sum(not c.gradient and c.case is None for c in changes)
    cased = sum(c.case is not None for c in changes)
    console.print(
        f"torch {old.torch} ({len(old.rows)} operators) -> torch {new.torch} ({len(new.rows)}), "
        f"{new.device} {new.dtype}: {forward} changed, {cased} cases changed, "
        f"{len(changes) - forward - cased} gradients changed",
        highlight=False,
    )
    if old.device != new.device or old.dtype != new.dtype:
        console.print(f"note: {old.device} {old.dtype} against {new.device} {new.dtype}")
    for index in (old, new):
        if index.gradients_not_judged:
            console.print(
                f"note: gradients not compared: torch {index.torch}'s index "
                f"says {index.gradients_not_judged}",
                highlight=False,
            )
    if not changes:
        return
    table = Table(expand=False)
    table.add_column("operator", style="bold", overflow="fold")
    table.add_column("of", no_wrap=True)
    table.add_column(old.torch, no_wrap=True)
    table.add_column(new.torch, no_wrap=True)
    table.add_column("", no_wrap=True)
    order = {False: 0, True: 1, None: 2}
    ranked = sorted(changes, key=lambda c: (c.gradient, c.case is not None, order[c.better], c.op))
    for change in ranked:
        word = {
            False: "worse",
            True: "better",
            None: "only in new" if change.old is None else "only in old",
        }
        of = "gradient" if change.gradient else change.case or "forward"
        table.add_row(change.op, of, _word(change.old), _word(change.new), word[change.better])
    console.print(table)


def _word(behaviour: OpBehaviour | None) -> str:
    return "-" if behaviour is None else behaviour.value


def _rows_text(rows: tuple[OperatorRow, ...], gradient: bool = False, top: int = 4) -> str:
    """Each row's behaviour (for a backward operation, its gradient's)."""
    text = ", ".join(
        f"{r.op}: gradient {_word(r.gradient)}" if gradient else f"{r.op}: {_word(r.behaviour)}"
        for r in rows[:top]
    )
    return text + (f" (+{len(rows) - top})" if len(rows) > top else "")


def _operation(python_op: str | None, aten_op: str | None) -> str:
    return f"{python_op or '-'} ({aten_op or '-'})"


def render_op_costs(
    index: OpsIndex, costs: tuple[OpCost, ...], console: Console, top: int = 30
) -> None:
    """The operations whose losses cost the sweeps' models most, each beside the index's rows
    for it (what the operator does with channels_last input in torch's own samples)."""
    console.print(
        f"the operations that wrote the NCHW data the sweeps' cost sites convert, costliest "
        f"first ({len(costs)}; index: torch {index.torch}, {index.device} {index.dtype})",
        highlight=False,
    )
    table = Table(expand=True)
    table.add_column("operation", style="bold", overflow="fold", ratio=2)
    table.add_column("models", justify="right", no_wrap=True)
    table.add_column("channels_last adds", justify="right", no_wrap=True)
    table.add_column("in the index", overflow="fold", ratio=3)
    for cost in costs[:top]:
        table.add_row(
            _operation(cost.python_op, cost.aten_op),
            str(cost.models),
            f"{cost.bytes / 2**20:.1f} MiB",
            _rows_text(cost.rows, cost.gradient)
            or "none (not in the database, or it takes no 4-D input)",
        )
    console.print(table)
    if len(costs) > top:
        console.print(f"{top} of {len(costs)} operations shown", highlight=False)


def _bytes_kind(link: OpLink) -> str:
    """What a link's bytes are: only channels_last's (a cost site), or all it converted (an
    offender that NCHW converts as much, no cost)."""
    return "channels_last only" if link.extra else "converted"


def render_op_links(index: OpsIndex, links: tuple[OpLink, ...], console: Console) -> None:
    """Each operation that lost channels_last in a model, beside its rows in ``index``."""
    if not links:
        console.print("no operation lost channels_last: nothing to look up in the operator index")
        return
    console.print(
        f"In torch's operator index (torch {index.torch}, {index.device} {index.dtype}"
        f"{', predicted' if index.predicted else ''}):",
        highlight=False,
    )
    table = Table(expand=True)
    table.add_column("operation", style="bold", overflow="fold", ratio=2)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("index rows", overflow="fold", ratio=2)
    table.add_column("reading", overflow="fold", ratio=3)
    for link in links:
        table.add_row(
            _operation(link.python_op, link.aten_op),
            f"{format_bytes(link.bytes)}\n{_bytes_kind(link)}",
            _rows_text(link.rows, link.gradient),
            link.reading,
        )
    console.print(table)
