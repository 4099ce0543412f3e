"""The comparison of two ledgers, a channels_last run and the same forward or step in NCHW:
what channels_last costs, site by site, and the verdict the gate gives it."""

from __future__ import annotations

from dataclasses import replace

from cl_audit.compare.remedies import SiteContext, remedy_for, site_contexts
from cl_audit.enums import CostKind, Evidence, Verdict
from cl_audit.intercept.ledger import Ledger, Place
from cl_audit.report.verdict import Cost, CostSite, Gate, MixedSite, fixed_extra

__all__ = ["compare_ledgers"]


def _kind(place: Place) -> CostKind:
    if place.parameter:
        return CostKind.PARAMETER
    return CostKind.KERNEL if place.in_kernel else CostKind.COPY


def _site(
    place: Place, cl: list[int], nchw: list[int], channels_last: Ledger, context: SiteContext
) -> CostSite:
    module_path, call_site = place.module_path, place.call_site
    python_op, aten_op = place.python_op, place.aten_op
    kind = _kind(place)
    causes = channels_last.causes.get(place)
    fix, root = causes.most_common(1)[0][0] if causes else (None, None)
    here = (call_site, module_path)
    if fix is not None and (fix.call_site, fix.module_path) == here:
        fix = None  # the site made its own NCHW-ordered data
    if root is not None and (root == fix or (root.call_site, root.module_path) == here):
        root = None  # named already
    fix_ops = () if fix is None else (fix.python_op, fix.aten_op)
    shaped = channels_last.copy_shapes
    shapes = (
        shaped.get((call_site, python_op)),
        None if fix is None else shaped.get((fix.call_site, fix.python_op)),
    )
    costs = cl[1] > nchw[1]  # a remedy only where channels_last costs bytes
    remedy = remedy_for(kind, (python_op, aten_op), fix_ops, context, shapes) if costs else None
    return CostSite(
        kind=kind,
        phase=place.phase,
        op=python_op or aten_op or "?",
        aten_op=aten_op,
        module_path=module_path,
        module_class=place.module_class,
        call_site=call_site,
        channels_last_bytes=cl[1],
        nchw_bytes=nchw[1],
        channels_last_count=cl[0],
        nchw_count=nchw[0],
        fix_site=fix,
        root_cause=root,
        remedy=remedy,
        strides=channels_last.strides.get(place),
    )


def compare_ledgers(
    channels_last: Ledger,
    nchw: Ledger,
    gate: Gate,
    device: str,
    batch: int | None = None,
    time_share: float | None = None,
) -> Cost:
    """Each place where the runs copied different bytes is a site; one conversion is counted
    once, at the place it happened. ``device``: the run's device type (remedies hold per
    device); ``batch``: the audited batch, which the gate projects from; ``time_share``: the
    losses' share of a timed step."""
    none = [0, 0]
    places = [
        (place, channels_last.copies.get(place, none), nchw.copies.get(place, none))
        for place in dict.fromkeys([*channels_last.copies, *nchw.copies])
    ]
    contexts = site_contexts(
        (
            (place.module_path, _kind(place), (place.python_op, place.aten_op))
            for place, cl, ref in places
            if cl[1] > ref[1]
        ),
        device,
    )
    plain = SiteContext(device)
    sites = tuple(
        sorted(
            (
                _site(place, cl, ref, channels_last, contexts.get(place.module_path, plain))
                for place, cl, ref in places
                if cl[1] != ref[1]
            ),
            key=lambda s: (-s.extra, -s.saved, s.op),
        )
    )
    mixed = tuple(
        MixedSite(
            op=place.python_op or place.aten_op or "?",
            phase=place.phase,
            module_path=place.module_path,
            call_site=place.call_site,
            count=entry[0],
            bytes_read=entry[1],
        )
        for place, entry in sorted(channels_last.mixed.items(), key=lambda item: -item[1][1])
        if place not in nchw.mixed
    )
    cost = Cost(
        gate=gate,
        verdict=Verdict.CLEAN,  # judged below, at the gate's batch
        bytes_written=channels_last.written,
        extra_bytes=sum(s.extra for s in sites),
        saved_bytes=sum(s.saved for s in sites),
        kernel_copies=Evidence.MEASURED if channels_last.measured else Evidence.PREDICTED,
        kernel_copy_table=None
        if channels_last.measured or channels_last.kernel_copies is None
        else channels_last.kernel_copies.name,
        sites=sites,
        mixed=mixed,
        unlocated_bytes=channels_last.unlocated,
        batch=batch,
        fixed_bytes=fixed_extra(sites),
        fixed_written_bytes=channels_last.written_fixed,
    )
    return replace(cost, verdict=cost.judged(sites, time_share))
