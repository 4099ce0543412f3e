"""The sections an audit's phases return, from which ``execution.assemble`` builds the report.

Each phase of an audit (the audited run, the training step's facts, the NCHW comparison) hands
back one of these; timing and compile hand back the report's own ``Timing`` and ``Compiled``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cl_audit.enums import Engine, TensorMode
from cl_audit.report.model_report import (
    AppliedOverride,
    DifferentialRun,
    Finding,
    GradientLayout,
    TimelineEvent,
)
from cl_audit.report.verdict import Cost

__all__ = ["Comparison", "Conditions", "Observed", "Training"]


@dataclass(frozen=True)
class Observed:
    """What the audited run saw, before any comparison: its findings (activation losses,
    regains, parameter conversions), its counts, and the first 4D/5D input's device and dtype."""

    calls_checked: int
    distinct_ops: int
    offenders: tuple[Finding, ...]
    regains: tuple[Finding, ...]
    parameter_conversions: tuple[Finding, ...]
    unwrapped: tuple[str, ...]
    timeline: tuple[TimelineEvent, ...]
    device: str | None
    dtype: str | None


@dataclass(frozen=True)
class Conditions:
    """How the run ran, as its environment records it (device and dtype: those seen when
    None)."""

    engine: Engine
    mode: TensorMode = TensorMode.EAGER
    device: str | None = None
    dtype: str | None = None
    autocast: str | None = None
    fake_divergences: str | None = None  # fake runs: the divergence table that applies
    kernel_overrides: tuple[AppliedOverride, ...] = ()  # fake CUDA: from kernel source


@dataclass(frozen=True)
class Training:
    """A training step's own facts: the optimizer and the gradients' layouts."""

    optimizer: str | None
    gradient_layouts: tuple[GradientLayout, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """The NCHW comparison: how it went, the offenders with terminal losses sorted by their
    NCHW counterparts (neutral ones in ``format_neutral``), and the cost when weighed."""

    differential: DifferentialRun
    offenders: tuple[Finding, ...]
    format_neutral: tuple[Finding, ...] = ()
    cost: Cost | None = None
