"""Inductor's layout decisions for the model's compiled graphs (``--compile``), set beside the
eager audit's losses."""

from __future__ import annotations

from cl_audit.compiled.graphs import beside_eager, compiled_layouts
from cl_audit.enums import Stage
from cl_audit.phases.subject import Sections, Subject
from cl_audit.report import Compiled
from cl_audit.rule.attribution import model_failed

__all__ = ["compile_phase"]


def compile_phase(subject: Subject, done: Sections) -> Compiled | None:
    """The compiled section, with ``compile`` (else None); ``ModelFailedError`` at the compile
    stage when capture fails."""
    plan, model, example = subject.plan, subject.model, subject.run.example
    settings = plan.settings
    if not settings.compile:
        return None
    assert done.comparison is not None  # set beside the eager losses
    losses = done.comparison.comparison.offenders
    try:
        compiled = compiled_layouts(
            model,
            example,
            device=plan.device,
            train=plan.workload.train,
            amp=settings.amp,
            strategy=settings.strategy,
            seed=settings.seed,
            force=settings.force_layout_opt,
        )
    except Exception as e:  # the settings refused a torch that cannot capture (UsageError)
        raise model_failed(Stage.COMPILE, subject.label, e) from e
    return beside_eager(compiled, losses)
