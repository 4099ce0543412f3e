"""Inductor's layout decisions for the model's compiled graphs (``--compile``), set beside the
eager audit's losses."""

from __future__ import annotations

from torch import nn

from cl_audit.compiled.graphs import beside_eager, compiled_layouts
from cl_audit.enums import Stage
from cl_audit.errors import ModelFailedError
from cl_audit.execution.inputs import Example
from cl_audit.execution.plan import RunPlan
from cl_audit.report import Compiled, Finding

__all__ = ["compile_phase"]


def compile_phase(
    plan: RunPlan, model: nn.Module, example: Example, losses: tuple[Finding, ...], label: str
) -> Compiled:
    """The compiled section; ``ModelFailedError`` at the compile stage when capture fails."""
    settings = plan.settings
    try:
        compiled = compiled_layouts(
            model,
            example,
            device=str(plan.device),
            train=plan.workload.train,
            amp=settings.amp,
            strategy=settings.strategy,
            seed=settings.seed,
            force=settings.force_layout_opt,
        )
    except Exception as e:  # the settings refused a torch that cannot capture (UsageError)
        raise ModelFailedError(Stage.COMPILE, label, e) from e
    return beside_eager(compiled, losses)
