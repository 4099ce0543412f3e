"""What every phase of one audit is handed: the ``Subject`` (the plan, the bound run, the model,
its converted forward, the label and the training loss) and the ``Sections`` the phases before
it returned."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cl_audit.execution.plan import RunPlan
from cl_audit.execution.tensors import Forward, TensorRun
from cl_audit.intercept.ledger import Ledger
from cl_audit.phases.timed import Measured
from cl_audit.report import Compiled, Timing
from cl_audit.report.sections import Comparison, Observed, Training
from cl_audit.report.speed_report import Speed

__all__ = ["Audited", "Compared", "Sections", "Subject"]


@dataclass(frozen=True)
class Subject:
    """The model under audit, bound to its plan's tensors."""

    plan: RunPlan
    run: TensorRun
    model: nn.Module
    forward: Forward  # the converted model's forward (``run.converted()``)
    label: str  # how failures name the model
    loss: Callable[[Any], torch.Tensor] | None  # a training step's loss (None: the default)


@dataclass(frozen=True)
class Audited:
    """The audited run's sections, its cost ledger for the comparison, the names of the
    model's tensors its convolutions took as their weight, and with ``time`` the rounds
    measured before it (the ``--time`` box's step and the speed section's)."""

    observed: Observed
    training: Training | None
    timing: Timing | None
    ledger: Ledger | None
    convolution_weights: frozenset[str] = frozenset()
    measured: Measured | None = None


@dataclass(frozen=True)
class Compared:
    """The NCHW comparison's section, and the NCHW run's ledger (None where none was kept)."""

    comparison: Comparison
    ledger: Ledger | None = None


@dataclass(frozen=True)
class Sections:
    """What the phases returned so far, a field per section (None: not yet, or not asked for)."""

    audited: Audited | None = None
    comparison: Compared | None = None
    compiled: Compiled | None = None
    speed: Speed | None = None
