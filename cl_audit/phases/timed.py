"""With ``time``: the step measured once per layout, unaudited, before the audited run.

The audited layout, and NCHW where the audit compares with it, each on a copy of the model of
its own, timed in alternating rounds (``execution.rounds``, as ``cl-audit bench`` times), then
each profiled for one step: every operation's own time (the kernels' on CUDA, the CPU's on the
CPU) by class. The ``--time`` box's step and the speed section's read these same rounds: one
step time per layout wherever it is printed.
"""

from __future__ import annotations

import contextlib
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cl_audit.compat.compile_run import compiled_graph_calls, compiled_step_classes
from cl_audit.compat.profiler_events import enclosing
from cl_audit.enums import CompiledClass, SpeedClass, Strategy
from cl_audit.execution.inputs import Example
from cl_audit.execution.plan import RunPlan
from cl_audit.execution.rounds import (
    ROUNDS,
    STEPS,
    WARMUP,
    Configuration,
    alternate,
    compile_configuration,
    configure,
)
from cl_audit.execution.timing import Profiler, timed_ms
from cl_audit.predict.speed_model import speed_kind
from cl_audit.registry import OpClass, classes_of
from cl_audit.report.compiled_speed import CompiledClassTime, CompiledLayout, GraphLayout
from cl_audit.report.stages import BACKWARD, OPTIMIZER, ROOT, StageCut

__all__ = [
    "CompiledRounds",
    "LayoutRounds",
    "Measured",
    "measure",
    "measure_compiled",
    "profiled_class",
]


@dataclass(frozen=True)
class LayoutRounds:
    """One layout's rounds (milliseconds per step, each the mean of a round's ``STEPS``) and,
    where profiled, its operations' own time by class and (with a cut) by stage."""

    rounds_ms: tuple[float, ...]
    classes: Mapping[SpeedClass, float] = field(default_factory=dict)
    stages: Mapping[str, float] = field(default_factory=dict)

    @property
    def ms(self) -> float:
        """The median round's step."""
        return statistics.median(self.rounds_ms)


@dataclass(frozen=True)
class CompiledRounds:
    """Both layouts compiled and timed (``measure_compiled``), and their profiled steps'
    milliseconds by class."""

    audited: CompiledLayout
    nchw: CompiledLayout
    classes: tuple[CompiledClassTime, ...]


@dataclass(frozen=True)
class Measured:
    """The audited layout's rounds, and NCHW's (None: the model's format is the caller's, so
    nothing is compared and nothing profiled); the stage cut the profiles were split by."""

    audited: LayoutRounds
    nchw: LayoutRounds | None
    cut: StageCut | None = None
    compiled: CompiledRounds | None = None  # with ``compile``: both layouts compiled


def measure(
    plan: RunPlan,
    model: nn.Module,
    example: Example,
    loss: Callable[[Any], torch.Tensor] | None,
    label: str,
    cut: StageCut | None = None,
) -> Measured:
    """The rounds of the plan's strategy and, where it is compared, NCHW's, alternated, each
    on a copy of ``model``; each compared layout then profiled for one step (with a ``cut``,
    split by stage too). ``ModelFailedError`` names the configuration that failed."""
    strategy = plan.settings.strategy
    amp = plan.settings.amp is not None
    strategies = (Strategy.NCHW, strategy) if strategy.compared else (strategy,)
    configurations = [configure(model, example, plan, s, amp, loss) for s in strategies]
    rounds, _ = alternate(configurations, ROUNDS, WARMUP, STEPS, plan.device, label)
    if not strategy.compared:
        return Measured(LayoutRounds(rounds[configurations[0].name]), None)
    nchw, audited = (
        LayoutRounds(rounds[c.name], *_profiled(c, plan.device, cut)) for c in configurations
    )
    compiled = measure_compiled(plan, configurations, label) if plan.settings.compile else None
    return Measured(audited, nchw, cut, compiled)


def measure_compiled(
    plan: RunPlan, configurations: list[Configuration], label: str
) -> CompiledRounds:
    """The configurations (NCHW's, then the audited layout's) compiled as the settings say
    (``compile_configuration``: the compile timed apart), warmed until settled, timed in the
    same alternating rounds as their eager steps, then each profiled for one step."""
    device = plan.device
    options = plan.settings.compile_options
    compiled = [compile_configuration(c, options, device) for c in configurations]
    rounds, _ = alternate(compiled, ROUNDS, WARMUP, STEPS, device, label)
    layouts, by_class = [], []
    for c in compiled:
        layout, classes = _profiled_compiled(c, rounds[c.name], device)
        layouts.append(layout)
        by_class.append(classes)
    nchw, audited = layouts
    classes = tuple(
        CompiledClassTime(k, round(by_class[1][k], 4), round(by_class[0][k], 4))
        for k in CompiledClass
    )
    return CompiledRounds(audited, nchw, classes)


def _profiled_compiled(
    c: Configuration, rounds_ms: tuple[float, ...], device: torch.device
) -> tuple[CompiledLayout, dict[CompiledClass, float]]:
    """One compiled step under the profiler: its milliseconds by class, and the layout's
    figures with what its compile did."""
    with Profiler(device, times=True) as profiler:
        step_ms = timed_ms(lambda: c.step.run(c.forward, None), device)
    events = list(profiler.events())
    watch = c.watch
    assert watch is not None  # compiled by compile_configuration
    layout = CompiledLayout(
        rounds_ms=rounds_ms,
        compile_seconds=round(watch.seconds, 3),
        graphs=watch.graphs,
        graph_breaks=watch.graph_breaks,
        graph_calls=compiled_graph_calls(events),
        lowered=tuple(GraphLayout(d.phase, d.layout_optimization) for d in watch.decisions),
        profiled_ms=round(step_ms, 4),
    )
    return layout, compiled_step_classes(events, step_ms, device)


_COPIES = frozenset({OpClass.COPY, OpClass.COPY_INTO})


def _profiled(
    c: Configuration, device: torch.device, cut: StageCut | None
) -> tuple[dict[SpeedClass, float], dict[str, float]]:
    """One step of a configuration under the profiler: milliseconds by class, from each
    operation's own time (a convolution's backward as its gradients together: the profiler
    holds both in one operation), and with a ``cut`` by stage (``_stage_ranges``)."""
    with _stage_ranges(c.model, cut), Profiler(device, times=True) as profiler:
        c.step.run(c.forward, None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    by_class: dict[SpeedClass, float] = defaultdict(float)
    by_stage: dict[str, float] = defaultdict(float)
    for event in profiler.events():
        if not event.name.startswith("aten::"):
            continue
        us = getattr(event, "self_device_time_total", 0.0) if device.type == "cuda" else (
            event.self_cpu_time_total
        )  # fmt: skip
        if us <= 0:
            continue
        by_class[profiled_class(event.name)] += us / 1e3
        if cut is not None:
            by_stage[_stage_of(event)] += us / 1e3
    return dict(by_class), dict(by_stage)


_RANGE = "cl-audit stage: "


@contextlib.contextmanager
def _stage_ranges(model: nn.Module, cut: StageCut | None) -> Iterator[None]:
    """Each module but the root runs its forward inside a profiler range named by its stage
    (``StageCut.of``: its part, or itself above the cut), on the configuration's own copy of
    the model, so that the innermost range names an operation's stage as a predicted run's
    does; the hooks go on exit."""
    if cut is None:
        yield
        return
    open_ranges: list[Any] = []

    def enter(name: str) -> Callable[..., None]:
        def hook(*_: object) -> None:
            open_ranges.append(torch.profiler.record_function(_RANGE + name).__enter__())

        return hook

    def leave(*_: object) -> None:
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    handles = []
    for path, module in model.named_modules():
        if path:
            handles.append(module.register_forward_pre_hook(enter(cut.of(path))))
            handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _stage_of(event: Any) -> str:
    """The stage a profiled operation ran in: the innermost stage range around it, a
    backward's (the autograd engine runs it outside every range) or the optimizer's."""
    for name in enclosing(event):
        if name.startswith(_RANGE):
            return name[len(_RANGE) :]
        if name.startswith("autograd::engine"):
            return BACKWARD
        if name.startswith("Optimizer."):
            return OPTIMIZER
    return ROOT


def profiled_class(name: str) -> SpeedClass:
    """The class of an operation the profiler names (``aten::mkldnn_convolution``): a copy's
    own time is a conversion's, a convolution's (the kernels it runs inside declared with it in
    the operator registry) the forward's, a convolution backward's both gradients'; the rest as
    the speed model classes them."""
    bare = name.removeprefix("aten::")
    classes = classes_of(f"aten.{bare}")
    if classes & _COPIES:
        return SpeedClass.CONVERSION
    if OpClass.CONVOLUTION in classes:
        return SpeedClass.CONV_FORWARD
    if "convolution_backward" in bare:
        return SpeedClass.CONV_GRADIENTS
    packet = getattr(torch.ops.aten, bare, None)
    op = getattr(packet, "default", None) if packet is not None else None
    if op is None:
        return SpeedClass.OTHER
    return speed_kind(op)[1]
