"""Does channels_last pay: the step's time in both layouts, measured or predicted.

Measured, with ``time`` on an eager run: the model in channels_last and in NCHW, each on a copy
of its own, timed in alternating rounds (``execution.rounds``, as ``cl-audit bench`` times),
then each profiled for one step: every operation's own time (the kernels' on CUDA, the CPU's
on the CPU) by class. Predicted otherwise: the device's operation time table
(``predict.speed_table``) applied to both runs' operations as their ledgers saw them
(``predict.speed_model``), or unknown, saying why, where no table or no NCHW run exists.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from cl_audit.enums import SpeedBasis, SpeedClass, SpeedVerdict, Strategy
from cl_audit.execution.plan import RunPlan
from cl_audit.execution.rounds import Configuration, alternate, configure
from cl_audit.execution.timing import Profiler
from cl_audit.predict.speed_model import StepTime, predict, speed_kind
from cl_audit.predict.speed_table import SpeedTable, table_for
from cl_audit.report.speed_report import (
    ClassTime,
    LayoutTime,
    Speed,
    round_ratios,
    speed_verdict,
)
from cl_audit.run.phases.audited import COMPARED
from cl_audit.run.phases.subject import Sections, Subject

__all__ = ["ROUNDS", "STEPS", "WARMUP", "speed_phase"]

ROUNDS, STEPS, WARMUP = 7, 3, 3  # measured: alternating rounds, steps a round, least warm-up


def speed_phase(subject: Subject, done: Sections) -> Speed:
    """The speed section (see the module docstring)."""
    plan = subject.plan
    settings = plan.settings
    band, device = settings.gate.slowdown, plan.device.type
    if settings.strategy not in COMPARED:
        return _unknown(band, device, "the model's format is the caller's: nothing to compare")
    if settings.time and not plan.tensors.predicted:
        return _measured(subject, band)
    return _predicted(subject, done, band)


def _unknown(band: float, device: str, note: str) -> Speed:
    return Speed(None, SpeedVerdict.UNKNOWN, band, device, note=note)


def _dtype(plan: RunPlan) -> str:
    """The dtype the operations compute in: autocast's, else the model's."""
    amp = plan.settings.amp
    dtype = amp.torch_dtype if amp is not None else plan.settings.dtype.torch_dtype
    return str(dtype).removeprefix("torch.")


def _predicted(subject: Subject, done: Sections, band: float) -> Speed:
    plan = subject.plan
    device = plan.device.type
    audited, compared = done.audited, done.comparison
    cl = None if audited is None else audited.ledger
    nchw = None if compared is None else compared.ledger
    if cl is None or nchw is None:
        why = "no NCHW run" if plan.settings.differential else "no NCHW run (differential off)"
        return _unknown(band, device, f"{why}: nothing to predict against")
    table = table_for(device)
    if table is None:
        return _unknown(
            band,
            device,
            f"no speed table for {device} (cl_audit/predict/tables): measure one with "
            f"scripts/op_times.py --device {device}, or time the model here with `time`",
        )
    dtype = _dtype(plan)
    if dtype not in table.dtypes():
        return _unknown(band, device, f"{table.name} holds no {dtype} measurements")
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    train = plan.workload.train
    steps = [
        predict(ledger.times, table, dtype, train, ledger.converted_in_kernels() // size)
        for ledger in (cl, nchw)
    ]
    return _section(steps[0], steps[1], table, dtype, train, band, device)


def _section(
    cl: StepTime,
    nchw: StepTime,
    table: SpeedTable,
    dtype: str,
    train: bool,
    band: float,
    device: str,
) -> Speed:
    if cl.ms <= 0 or nchw.ms <= 0:
        return _unknown(band, device, "the step runs no operation: nothing to time")
    speedup = nchw.ms / cl.ms
    classes = _classes(cl.by_class, nchw.by_class)
    sites = max(cl.by_class.get(SpeedClass.CONVERSION, 0.0)
                - nchw.by_class.get(SpeedClass.CONVERSION, 0.0), 0.0)  # fmt: skip
    stand_ins = sorted(set(cl.stand_ins) | set(nchw.stand_ins))
    settings = (
        ("table", table.described),
        ("dtype", dtype),
        ("workload", "training step" if train else "forward"),
        ("host per operation", f"{table.host_us[train]:.1f} us"),
        ("kernel time waited for", f"{table.overlap:.2f}"),
    )
    return Speed(
        basis=SpeedBasis.PREDICTED,
        verdict=speed_verdict(speedup, None, None, band),
        band=band,
        device=device,
        speedup=speedup,
        channels_last=LayoutTime(cl.ms, cl.device_ms, cl.host_ms, cl.launches),
        nchw=LayoutTime(nchw.ms, nchw.device_ms, nchw.host_ms, nchw.launches),
        classes=classes,
        conversion_share=_share(cl.by_class.get(SpeedClass.CONVERSION, 0.0) * table.overlap, cl.ms),
        sites_ms=sites * table.overlap,
        fixed_speedup=_fixed(nchw.ms, cl.ms, sites * table.overlap),
        table=table.name,
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


def _measured(subject: Subject, band: float) -> Speed:
    plan, run = subject.plan, subject.run
    device = plan.device
    amp = plan.settings.amp is not None
    configurations = [
        configure(subject.model, run.example, plan, strategy, amp, subject.loss)
        for strategy in (Strategy.NCHW, Strategy.CHANNELS_LAST)
    ]
    rounds, _ = alternate(configurations, ROUNDS, WARMUP, STEPS, device, subject.label)
    nchw_rounds, cl_rounds = (rounds[c.name] for c in configurations)
    low, speedup, high = round_ratios(nchw_rounds, cl_rounds)
    profiled = [_profiled(c, device) for c in configurations]
    nchw_classes, cl_classes = profiled
    cl_ms = sorted(cl_rounds)[len(cl_rounds) // 2]
    nchw_ms = sorted(nchw_rounds)[len(nchw_rounds) // 2]
    sites = max(cl_classes.get(SpeedClass.CONVERSION, 0.0)
                - nchw_classes.get(SpeedClass.CONVERSION, 0.0), 0.0)  # fmt: skip
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
        channels_last=LayoutTime(cl_ms, sum(cl_classes.values()), rounds_ms=cl_rounds),
        nchw=LayoutTime(nchw_ms, sum(nchw_classes.values()), rounds_ms=nchw_rounds),
        classes=_classes(cl_classes, nchw_classes),
        conversion_share=_share(cl_classes.get(SpeedClass.CONVERSION, 0.0), cl_ms),
        sites_ms=sites,
        fixed_speedup=_fixed(nchw_ms, cl_ms, sites),
        settings=settings,
    )


# the profiler's names of operations that run inside the ones the audit sees
_FORWARD = ("mkldnn_convolution", "cudnn_convolution", "_convolution", "_conv_depthwise2d",
            "_slow_conv2d_forward", "convolution")  # fmt: skip
_PROFILED = {name: SpeedClass.CONV_FORWARD for name in _FORWARD} | {
    name: SpeedClass.CONVERSION for name in ("copy_", "clone", "contiguous")
}


def _profiled(c: Configuration, device: torch.device) -> dict[SpeedClass, float]:
    """One step of a configuration under the profiler: milliseconds by class, from each
    operation's own time (a convolution's backward as its gradients together: the profiler
    holds both in one operation)."""
    with Profiler(device, times=True) as profiler:
        c.step.run(c.forward, None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    by_class: dict[SpeedClass, float] = defaultdict(float)
    for event in profiler.events().key_averages():
        if not event.key.startswith("aten::"):
            continue
        us = getattr(event, "self_device_time_total", 0.0) if device.type == "cuda" else (
            event.self_cpu_time_total
        )  # fmt: skip
        if us <= 0:
            continue
        bare = event.key.removeprefix("aten::")
        cls = _PROFILED.get(bare)
        if cls is None:
            cls = _class_of_name(bare)
        by_class[cls] += us / 1e3
    return dict(by_class)


def _class_of_name(bare: str) -> SpeedClass:
    if "convolution_backward" in bare:
        return SpeedClass.CONV_GRADIENTS
    packet = getattr(torch.ops.aten, bare, None)
    op = getattr(packet, "default", None) if packet is not None else None
    if op is None:
        return SpeedClass.OTHER
    return speed_kind(op)[1]
