"""``cl-audit bench``: a model timed side by side in conversion strategies, and the time of the
audit's findings in the channels-last configuration.

Each configuration (a strategy, with or without autocast) runs on a deep copy of the model,
converted once, so the caller's model is never touched and no conversion is timed. After
``warmup`` steps each, rounds alternate between the configurations, the order rotating every
round; a round times ``steps_per_round`` steps (synchronised on CUDA) and records their mean.
The channels-last configuration is then audited once with ``--time`` (its audited step under
``torch.profiler``): each finding gets the time of its own calls.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cl_audit.compat.compile_run import compile_options_problem
from cl_audit.enums import Conversion, Strategy
from cl_audit.errors import UsageError
from cl_audit.execution.assemble import environment_of
from cl_audit.execution.inputs import Example, example_of
from cl_audit.execution.plan import RunPlan, plan_run
from cl_audit.execution.rounds import (
    ROUNDS,
    STEPS,
    WARMUP,
    alternate,
    compile_configuration,
    configure,
)
from cl_audit.execution.settings import AuditSettings, CompileOptions
from cl_audit.phases.audit_module import audit_module
from cl_audit.report import ModelReport, by_call_site
from cl_audit.report.bench_report import (
    Attribution,
    BenchReport,
    FindingTime,
    StrategyTiming,
)
from cl_audit.report.environment import dtype_name
from cl_audit.report.sections import Training

__all__ = ["BENCH_STRATEGIES", "BenchSettings", "attribute", "bench_module"]

BENCH_STRATEGIES = (Strategy.NCHW, Strategy.CHANNELS_LAST, Strategy.CONV_WEIGHTS)


@dataclass(frozen=True)
class BenchSettings:
    """``audit``: what every configuration runs (batch, input, device, dtype, ``amp``, train);
    with ``amp`` each strategy runs with and without it. ``rounds`` >= 7 for a median worth
    reading; ``threads`` fixes torch's intra-op threads for the run (None: as it is); with
    ``compile``, nchw and channels-last are also timed compiled (each compiled apart first, its
    compile's time kept out of the rounds), in the same alternating rounds."""

    audit: AuditSettings
    strategies: tuple[Strategy, ...] = BENCH_STRATEGIES
    rounds: int = ROUNDS
    warmup: int = WARMUP
    steps_per_round: int = STEPS
    threads: int | None = None
    attribute: bool = True
    compile: CompileOptions | None = None  # also nchw and channels-last through torch.compile

    def __post_init__(self) -> None:
        if self.audit.predicted:
            raise UsageError("bench times kernels, and fake tensors run none: drop `fake`")
        if self.rounds < 1 or self.steps_per_round < 1 or self.warmup < 0:
            raise UsageError("bench: `rounds` and `steps` must be at least 1, `warmup` at least 0")
        if self.compile is not None:
            problem = compile_options_problem(self.compile.mode, self.compile.backend)
            if problem is not None:
                raise UsageError(problem)


def bench_module(
    model: nn.Module,
    inputs: tuple[Any, ...] | Example,
    settings: BenchSettings,
    *,
    name: str,
    source: str,
    loss: Callable[[Any], torch.Tensor] | None = None,
    plan: RunPlan | None = None,
) -> BenchReport:
    """Time ``model`` on ``inputs`` in every configuration, then attribute the channels-last
    step's time to the audit's findings. ``model`` is left as it was (copies are converted);
    ``loss(output)`` is a training step's loss (default: ``training_loss``); ``plan``: the
    plan of ``settings.audit`` where the caller made it already."""
    base = settings.audit
    plan = plan or plan_run(base)
    example = example_of(inputs)
    first = example.first
    if first is None:
        raise UsageError(f"bench {name}: the model's input holds no tensor")
    with _threads(settings.threads):
        configurations = [
            configure(model, example, plan, s, amp, loss) for s, amp in _configurations(settings)
        ]
        if settings.compile is not None:
            compiled = (Strategy.NCHW, Strategy.CHANNELS_LAST)
            configurations += [
                compile_configuration(
                    configure(model, example, plan, c.strategy, c.amp is not None, loss),
                    settings.compile,
                    plan.device,
                )
                for c in configurations
                if c.strategy in compiled
            ]
        rounds, warmed = alternate(
            configurations,
            settings.rounds,
            settings.warmup,
            settings.steps_per_round,
            plan.device,
            name,
        )
        attribution = None
        if settings.attribute and Strategy.CHANNELS_LAST in settings.strategies:
            cl = next(
                c
                for c in reversed(configurations)
                if c.strategy is Strategy.CHANNELS_LAST and c.watch is None
            )
            step_ms = statistics.median(rounds[cl.name])
            # Timed, and without the NCHW re-run: a differential verdict does not change what
            # a step costs.
            timed = cl.plan.changed(time=True, differential=False)
            audited = audit_module(copy.deepcopy(model), example, timed, name=name, loss=loss)
            attribution = attribute(audited, cl.name, step_ms)
        threads = torch.get_num_threads()
    training = Training(base.optimizer.value) if base.train else None
    environment = environment_of(
        plan.conditions(str(plan.device), dtype_name(first.dtype)), training
    )
    timings = tuple(
        StrategyTiming(
            c.name,
            c.strategy,
            c.amp and c.amp.value,
            rounds[c.name],
            warmed[c.name],
            compiled=c.watch is not None,
            compile_seconds=None if c.watch is None else round(c.watch.seconds, 3),
        )
        for c in configurations
    )
    return BenchReport(
        model=name,
        input_shape=tuple(first.shape),
        environment=environment,
        threads=threads,
        warmup=settings.warmup,
        steps_per_round=settings.steps_per_round,
        timings=timings,
        attribution=attribution,
    )


def _configurations(settings: BenchSettings) -> list[tuple[Strategy, bool]]:
    amps = (False, True) if settings.audit.amp is not None else (False,)
    return [(strategy, amp) for amp in amps for strategy in settings.strategies]


def attribute(report: ModelReport, configuration: str, step_ms: float) -> Attribution:
    """The timed audit's findings, grouped by call site, with their time."""
    found: list[FindingTime] = []
    groups = (
        (True, report.offenders),
        (False, report.parameter_conversions),
        (False, report.regains),
    )
    for offender, findings in groups:
        for group in by_call_site(findings):
            f = group.first
            found.append(
                FindingTime(
                    kind=f.kind,
                    offender=offender,
                    op=f.op,
                    aten_op=f.aten_op,
                    call_site=f.call_site,
                    module_path=f.module_path,
                    phase=f.phase,
                    count=group.count,
                    ms=group.time_ms or 0.0,
                )
            )
    if report.timing is None:
        raise ValueError("attribute() needs a report audited with time=True")
    return Attribution(
        configuration=configuration,
        step_ms=step_ms,
        clock=report.timing.clock,
        losses_ms=sum(f.ms for f in found if f.kind is Conversion.LOSS),
        regains_ms=sum(f.ms for f in found if f.kind is Conversion.REGAIN),
        findings=tuple(sorted(found, key=lambda f: -f.ms)),
        offenders=len(report.offenders),
    )


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's intra-op threads fixed to ``count`` inside, restored after."""
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
