"""Does channels_last pay: the step's time in both layouts, measured or predicted.

Measured, with ``time`` on an eager run: the rounds and profiles the audited phase measured
before the audited run (``timed.measure``: the audited layout and NCHW, each on a copy of its
own, alternated, then each profiled for one step), the same rounds the ``--time`` box reads.
Predicted otherwise: the device's operation time table (``predict.speed_table``) applied to
both runs' operations as their ledgers saw them (``predict.speed_model``), or unknown, saying
why, where no table or no NCHW run exists.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import torch

from cl_audit.enums import SpeedBasis, SpeedClass, SpeedVerdict
from cl_audit.execution.rounds import ROUNDS, STEPS, WARMUP
from cl_audit.intercept.ledger import Ledger
from cl_audit.phases.subject import Sections, Subject
from cl_audit.phases.timed import Measured
from cl_audit.predict.speed_model import StepTime, predict
from cl_audit.predict.table_store import Choice, choose, this_machine
from cl_audit.report.compiled_speed import CompiledSpeed
from cl_audit.report.speed_report import (
    ClassTime,
    LayoutTime,
    Speed,
    round_ratios,
    speed_verdict,
)
from cl_audit.report.stages import StageCut, StageTime
from cl_audit.report.verdict import Cost

__all__ = ["predict_speed", "speed_phase"]


def speed_phase(subject: Subject, done: Sections) -> Speed:
    """The speed section (see the module docstring), with ``compile`` its compiled part."""
    speed = _eager(subject, done)
    if not subject.plan.settings.compile:
        return speed
    measured = None if done.audited is None else done.audited.measured
    return replace(speed, compiled=_compiled(subject, measured, speed.band))


def _compiled(subject: Subject, measured: Measured | None, band: float) -> CompiledSpeed:
    """The compiled part: measured (``time``), else unknown, saying why: no table holds
    Inductor's fused kernels, so a compiled step is never predicted."""
    settings = subject.plan.settings
    options = settings.compile_options
    timed = None if measured is None else measured.compiled
    if timed is None:
        if not settings.strategy.compared:
            why = "the model's format is the caller's: nothing to compare"
        elif settings.predicted:
            why = (
                "a fake run times no kernel, and no table holds Inductor's fused kernels: the "
                "compiled step is not predicted (time it eagerly, with `time`)"
            )
        else:
            why = "no table holds Inductor's fused kernels: the compiled step is measured only, "
            why += "with `time`"
        return CompiledSpeed(SpeedVerdict.UNKNOWN, options, note=why)
    cl, nchw = timed.audited, timed.nchw
    low, speedup, high = round_ratios(nchw.rounds_ms, cl.rounds_ms)
    layouts = (("channels_last", cl), ("NCHW", nchw))
    uncounted = [name for name, layout in layouts if not layout.graphs]
    note = None
    if uncounted:
        note = (
            f"Dynamo compiled no graph for {' and '.join(uncounted)}: it ran graphs compiled "
            "earlier in this process for an equal copy (their guards held), or captured none; "
            "the compile's seconds, graphs and breaks there are not its own"
        )
    return CompiledSpeed(
        verdict=speed_verdict(speedup, low, high, band),
        options=options,
        speedup=speedup,
        low=low,
        high=high,
        channels_last=cl,
        nchw=nchw,
        classes=timed.classes,
        note=note,
    )


def _eager(subject: Subject, done: Sections) -> Speed:
    plan = subject.plan
    settings = plan.settings
    band, device = settings.gate.slowdown, plan.device.type
    if not settings.strategy.compared:
        return _unknown(band, device, "the model's format is the caller's: nothing to compare")
    measured = None if done.audited is None else done.audited.measured
    if measured is not None:
        speed = _measured(subject, measured, band)
        if measured.cut is None or measured.nchw is None:
            return speed
        compared = done.comparison
        cost = None if compared is None else compared.comparison.cost
        cl, nchw = dict(measured.audited.stages), dict(measured.nchw.stages)
        return replace(speed, stages=_stages(measured.cut, cl, nchw, cost))
    return _predicted(subject, done, band)


def _unknown(band: float, device: str, note: str) -> Speed:
    return Speed(None, SpeedVerdict.UNKNOWN, band, device, note=note)


def _predicted(subject: Subject, done: Sections, band: float) -> Speed:
    plan = subject.plan
    device = plan.device.type
    audited, compared = done.audited, done.comparison
    cl = None if audited is None else audited.ledger
    nchw = None if compared is None else compared.ledger
    if cl is None or nchw is None:
        why = "no NCHW run" if plan.settings.differential else "no NCHW run (differential off)"
        return _unknown(band, device, f"{why}: nothing to predict against")
    dtype = plan.settings.compute_dtype
    here = this_machine(device, plan.device.index or 0)
    choice = choose(device, dtype, plan.settings.table, here)
    if choice is None:
        return _unknown(
            band,
            device,
            f"no speed table for {device}: make this machine's (cl-audit table --device "
            f"{device}), or time the model here with `time`",
        )
    cost = None if compared is None else compared.comparison.cost
    return predict_speed(cl, nchw, choice, dtype, plan.workload.train, band, cost)


def predict_speed(
    cl: Ledger,
    nchw: Ledger,
    choice: Choice,
    dtype: str,
    train: bool,
    band: float,
    cost: Cost | None = None,
) -> Speed:
    """The speed section two runs' ledgers (channels_last, NCHW) make with the chosen table,
    their operations computing in ``dtype``, a forward's or a training step's host costs;
    where the ledgers recorded stages, each stage's time, with its sites' bytes from ``cost``."""
    table = choice.table
    if dtype not in table.dtypes():
        return _unknown(band, table.device, f"{table.name} holds no {dtype} measurements")
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    steps = [
        predict(
            ledger.times, table, dtype, train, ledger.converted_in_kernels() // size,
            _kernel_stages(ledger),
        )
        for ledger in (cl, nchw)
    ]  # fmt: skip
    speed = _section(steps[0], steps[1], choice, dtype, train, band, table.device)
    cut = cl.times.cut
    if cut is None or not speed.known:
        return speed
    return replace(speed, stages=_stages(cut, steps[0].by_stage, steps[1].by_stage, cost))


def _kernel_stages(ledger: Ledger) -> dict[str, float]:
    """The bytes converted inside kernels by stage (where the ledger recorded stages)."""
    cut = ledger.times.cut
    by_stage: dict[str, float] = defaultdict(float)
    if cut is not None:
        for place, (_, size) in ledger.copies.items():
            if place.in_kernel:
                by_stage[cut.of(place.module_path, place.phase)] += size
    return dict(by_stage)


def _stages(
    cut: StageCut, cl: dict[str, float], nchw: dict[str, float], cost: Cost | None
) -> tuple[StageTime, ...]:
    """Each stage with time in either layout or channels_last-only bytes, in the model's
    order (``StageCut.ordered``)."""
    extra: dict[str, int] = defaultdict(int)
    for site in () if cost is None else cost.sites:
        extra[cut.of(site.module_path, site.phase)] += site.extra
    names = [n for n in {*cl, *nchw, *extra} if cl.get(n) or nchw.get(n) or extra[n]]
    return tuple(
        StageTime(name, round(cl.get(name, 0.0), 4), round(nchw.get(name, 0.0), 4), extra[name])
        for name in cut.ordered(names)
    )


def _section(
    cl: StepTime,
    nchw: StepTime,
    choice: Choice,
    dtype: str,
    train: bool,
    band: float,
    device: str,
) -> Speed:
    if cl.ms <= 0 or nchw.ms <= 0:
        return _unknown(band, device, "the step runs no operation: nothing to time")
    table = choice.table
    speedup = nchw.ms / cl.ms
    classes = _classes(cl.by_class, nchw.by_class)
    sites = max(cl.by_class.get(SpeedClass.CONVERSION, 0.0)
                - nchw.by_class.get(SpeedClass.CONVERSION, 0.0), 0.0)  # fmt: skip
    stand_ins = sorted(set(cl.stand_ins) | set(nchw.stand_ins))
    host = table.host
    kinds = ("forward_grad", "backward", "optimizer") if train else ("forward",)
    settings = (
        ("table", table.described),
        ("match", choice.use.label),
        ("dtype", dtype),
        ("workload", "training step" if train else "forward"),
        ("host per operation", ", ".join(f"{k} {getattr(host, k):.1f} us" for k in kinds)),
        ("step", "the host's and the device's queue" if table.asynchronous
         else "each operation's host time, then its kernel"),
    )  # fmt: skip
    # the cost sites' time: the channels_last step replayed without the conversions it makes
    # beyond NCHW's (on a queue, a host-bound step hides part of them)
    converted = cl.by_class.get(SpeedClass.CONVERSION, 0.0)
    sites = cl.ms - cl.replayed_without_conversions(sites / converted) if converted else 0.0
    return Speed(
        basis=SpeedBasis.PREDICTED,
        verdict=speed_verdict(speedup, None, None, band),
        band=band,
        device=device,
        speedup=speedup,
        channels_last=LayoutTime(cl.ms, cl.device_ms, cl.host_ms, cl.launches),
        nchw=LayoutTime(nchw.ms, nchw.device_ms, nchw.host_ms, nchw.launches),
        classes=classes,
        conversion_share=_share(cl.ms - cl.replayed_without_conversions(1.0), cl.ms),
        sites_ms=sites,
        fixed_speedup=_fixed(nchw.ms, cl.ms, sites),
        table=choice.use,
        stand_ins=tuple(stand_ins),
        settings=settings,
    )


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _fixed(nchw_ms: float, cl_ms: float, sites_ms: float) -> float | None:
    """The speedup with the cost sites' time gone from the channels_last step."""
    return nchw_ms / (cl_ms - sites_ms) if sites_ms and cl_ms > sites_ms else None


def _classes(cl: dict[SpeedClass, float], nchw: dict[SpeedClass, float]) -> tuple[ClassTime, ...]:
    found = [c for c in SpeedClass if c in cl or c in nchw]
    return tuple(ClassTime(c, round(cl.get(c, 0.0), 4), round(nchw.get(c, 0.0), 4)) for c in found)


def _measured(subject: Subject, measured: Measured, band: float) -> Speed:
    """The speed section of the rounds the audited phase measured (``timed.measure``)."""
    plan = subject.plan
    device = plan.device
    cl, nchw = measured.audited, measured.nchw
    assert nchw is not None  # measured with the audit's strategy compared
    low, speedup, high = round_ratios(nchw.rounds_ms, cl.rounds_ms)
    sites = max(cl.classes.get(SpeedClass.CONVERSION, 0.0)
                - nchw.classes.get(SpeedClass.CONVERSION, 0.0), 0.0)  # fmt: skip
    clock = "the kernels' own time" if device.type == "cuda" else "the CPU's own time"
    settings = (
        ("rounds", str(ROUNDS)),
        ("steps a round", str(STEPS)),
        ("least warm-up", str(WARMUP)),
        ("threads", str(torch.get_num_threads())),
        ("autocast", plan.settings.amp.value if plan.settings.amp else "none"),
        ("workload", "training step" if plan.workload.train else "forward"),
        ("classes", f"one profiled step per layout, {clock} of each operation"),
    )
    return Speed(
        basis=SpeedBasis.MEASURED,
        verdict=speed_verdict(speedup, low, high, band),
        band=band,
        device=device.type,
        speedup=speedup,
        low=low,
        high=high,
        channels_last=LayoutTime(cl.ms, sum(cl.classes.values()), rounds_ms=cl.rounds_ms),
        nchw=LayoutTime(nchw.ms, sum(nchw.classes.values()), rounds_ms=nchw.rounds_ms),
        classes=_classes(dict(cl.classes), dict(nchw.classes)),
        conversion_share=_share(cl.classes.get(SpeedClass.CONVERSION, 0.0), cl.ms),
        sites_ms=sites,
        fixed_speedup=_fixed(nchw.ms, cl.ms, sites),
        settings=settings,
    )
