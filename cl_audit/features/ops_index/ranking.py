"""The index against audits: the operators a sweep's cost sites pay for, ranked
(``--from-sweep``), and each of a report's sites linked to its operator's row
(``--ops-index``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from cl_audit.enums import OpBehaviour
from cl_audit.report import ModelReport, SweepReport
from cl_audit.report.ops_report import OperatorRow, OpsIndex

__all__ = ["OpCost", "OpLink", "forward_of", "rank_costs", "report_links"]


@dataclass(frozen=True)
class OpCost:
    """An operation that lost channels_last across a registry: the Python and aten operation
    that wrote the NCHW data a cost site converts (its fix site, else the site's own), how many
    models it costs and the channels_last-only bytes, and the index's rows for it."""

    python_op: str | None
    aten_op: str | None
    models: int
    bytes: int
    rows: tuple[OperatorRow, ...]
    gradient: bool = False  # a backward operation: its rows' gradient column is what applies


_PREFIXES = ("Tensor.", "torch.", "F.", "nn.functional.")


def _bare(python_op: str) -> str:
    for prefix in _PREFIXES:
        if python_op.startswith(prefix):
            return python_op[len(prefix) :]
    return python_op


_NODE = re.compile(r"([A-Z][A-Za-z0-9]*?)Backward\d*")


def forward_of(python_op: str | None, aten_op: str | None) -> str | None:
    """The aten operation whose backward a backward operation runs, or None for a forward one:
    named by the autograd node running it (``NativeGroupNormBackward0`` runs
    ``native_group_norm``'s: derivatives.yaml names a node after its operator, in CamelCase),
    else by its own aten name (``aten.reflection_pad2d_backward``)."""
    match = _NODE.fullmatch(python_op or "")
    if match is not None:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", match[1]).lower()
        return "aten." + re.sub(r"(\d)_d(?=_|$)", r"\1d", snake)  # Pad2D: pad2d
    if aten_op is not None and aten_op.endswith("_backward"):
        return aten_op.removesuffix("_backward")
    return None


def _rows_for(index: OpsIndex, python_op: str | None, aten_op: str | None) -> tuple:
    """The index's rows for an operation: by name (``F.interpolate`` is
    ``nn.functional.interpolate`` and its variants; those whose samples' outputs the same aten
    operation made, where some are); by the aten operation alone only for a site without a
    Python name; for a backward operation, the row of the operator whose backward it runs
    (``forward_of``), whose gradient column applies."""
    forward = forward_of(python_op, aten_op)
    if forward is not None:  # the operator of that name (not those whose outputs it made:
        name = forward.removeprefix("aten.")  # a view makes many, whose backward is their own)
        return tuple(row for row in index.rows if _bare(row.op) == name)
    if python_op is not None:
        bare = _bare(python_op)
        named = tuple(
            row
            for row in index.rows
            if _bare(row.op) == bare or _bare(row.op).startswith(bare + ".")
        )
        exact = tuple(row for row in named if aten_op in row.aten_ops)
        return exact or named
    if aten_op is None:
        return ()
    return tuple(row for row in index.rows if aten_op in row.aten_ops)


def rank_costs(index: OpsIndex, sweeps: Iterable[SweepReport]) -> tuple[OpCost, ...]:
    """The operations whose losses cost the sweeps' models most, costliest first: each cost
    site with channels_last-only bytes is charged to the operation that wrote its NCHW data."""
    models: dict[tuple[str | None, str | None], set[str]] = {}
    spent: Counter[tuple[str | None, str | None]] = Counter()
    for sweep in sweeps:
        for row in sweep.models:
            for site in row.cost.sites if row.cost is not None else ():
                if site.extra <= 0:
                    continue
                fix = site.fix_site
                key = (fix.python_op, fix.aten_op) if fix else (site.op, site.aten_op)
                models.setdefault(key, set()).add(row.key)
                spent[key] += site.extra
    return tuple(
        OpCost(
            python_op,
            aten_op,
            len(models[key]),
            spent[key],
            _rows_for(index, *key),
            forward_of(*key) is not None,
        )
        for key, _ in spent.most_common()
        for python_op, aten_op in (key,)
    )


@dataclass(frozen=True)
class OpLink:
    """An operation that lost channels_last in one model (an offender, or the operation a cost
    site's channels_last-only bytes are charged to), with the bytes, and the index's rows for
    it: does it always lose the format, or only with this model's arguments and strides?"""

    python_op: str | None
    aten_op: str | None
    bytes: int
    rows: tuple[OperatorRow, ...]
    gradient: bool = False  # a backward operation: its rows' gradient column is what applies
    extra: bool = True  # bytes only channels_last writes (a cost site), else bytes converted

    @property
    def reading(self) -> str:
        """What the rows say of the loss, in a line."""
        counts: Counter[OpBehaviour] = Counter()
        for row in self.rows:
            counts.update(dict(row.gradient_counts if self.gradient else row.counts))
        total = sum(counts.values())
        lost = sum(counts[b] for b in (OpBehaviour.REFUSES, OpBehaviour.LOSES, OpBehaviour.OTHER))
        what = "its backward " if self.gradient else ""
        if not total:
            return f"not in the index (torch's database has no 4-D or 5-D sample of {what}it)"
        samples = "its one sample" if total == 1 else f"all {total} of its samples"
        if lost == total:
            return (
                f"{what}loses channels_last in {samples} in torch's database: the operator's to fix"
            )
        if lost:
            return (
                f"{what}loses channels_last in {lost} of its {total} samples in torch's "
                "database: only with some arguments or strides"
            )
        return (
            f"{what}keeps the order in {samples} in torch's database: lost with this model's "
            "arguments or strides, or in its code"
        )


def report_links(index: OpsIndex, report: ModelReport) -> tuple[OpLink, ...]:
    """Each operation that lost channels_last in ``report``, costliest first: the cost sites
    with channels_last-only bytes, charged as ``rank_costs`` charges them, then the offenders
    (the bytes they converted) not among them."""
    spent: Counter[tuple[str | None, str | None]] = Counter()
    for site in report.cost.sites if report.cost is not None else ():
        if site.extra > 0:
            fix = site.fix_site
            spent[(fix.python_op, fix.aten_op) if fix else (site.op, site.aten_op)] += site.extra
    converted: Counter[tuple[str | None, str | None]] = Counter()
    for finding in report.offenders:
        key = (finding.python_op, finding.aten_op)
        if key not in spent:
            converted[key] += finding.bytes_converted
    return tuple(
        OpLink(
            python_op,
            aten_op,
            n,
            _rows_for(index, python_op, aten_op),
            forward_of(python_op, aten_op) is not None,
            ledger is spent,
        )
        for ledger in (spent, converted)
        for (python_op, aten_op), n in ledger.most_common()
    )
