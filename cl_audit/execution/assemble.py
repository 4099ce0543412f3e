"""A ``ModelReport`` built once, from the sections an audit's phases returned, with one verdict."""

from __future__ import annotations

from dataclasses import replace

from cl_audit.report import (
    Compiled,
    DifferentialRun,
    Environment,
    ModelReport,
    Timing,
    summarise,
)
from cl_audit.report.environment import probe
from cl_audit.report.sections import Comparison, Conditions, Observed, Training
from cl_audit.report.speed_report import Speed

__all__ = ["assemble", "environment_of"]


def environment_of(conditions: Conditions, training: Training | None = None) -> Environment:
    """The environment a report records: the versions of the tool and its libraries, how the
    run ran, and whether it was a training step (with which optimizer)."""
    return replace(
        probe(
            device=conditions.device,
            dtype=conditions.dtype,
            autocast=conditions.autocast,
            engine=conditions.engine,
            mode=conditions.mode,
            train=training is not None,
            optimizer=None if training is None else training.optimizer,
        ),
        fake_divergences=conditions.fake_divergences,
        kernel_overrides=conditions.kernel_overrides,
    )


def assemble(
    observed: Observed,
    conditions: Conditions,
    *,
    model: str | None,
    input_shape: tuple[int, ...] | None,
    differential: DifferentialRun,
    training: Training | None = None,
    timing: Timing | None = None,
    comparison: Comparison | None = None,
    compiled: Compiled | None = None,
    speed: Speed | None = None,
) -> ModelReport:
    """The report of one audit. The verdict is the cost's when the comparison weighed one, else
    offending for any offender; ``differential`` says why no comparison ran when none did."""
    seen = replace(
        conditions,
        device=conditions.device or observed.device,
        dtype=conditions.dtype or observed.dtype,
    )
    offenders, neutral = observed.offenders, ()
    cost = None
    if comparison is not None:
        offenders, neutral = comparison.offenders, comparison.format_neutral
        differential, cost = comparison.differential, comparison.cost
    summary = summarise(
        observed.calls_checked,
        observed.distinct_ops,
        offenders,
        observed.regains,
        observed.parameter_conversions,
        neutral,
    )
    if cost is not None:
        summary = replace(summary, verdict=cost.verdict)
    return ModelReport(
        model=model,
        input_shape=input_shape,
        environment=environment_of(seen, training),
        summary=summary,
        offenders=offenders,
        regains=observed.regains,
        parameter_conversions=observed.parameter_conversions,
        format_neutral=neutral,
        differential=differential,
        unwrapped=observed.unwrapped,
        timeline=observed.timeline,
        gradient_layouts=() if training is None else training.gradient_layouts,
        timing=timing,
        cost=cost,
        compiled=compiled,
        speed=speed,
    )
