"""A built model (``LoadedModel``) audited: the model in the settings' dtype where the run plan
runs it, a random input of their shape, and the one audit path (``phases.audit_module``).
The CLI, the sweep worker, bench and the scripts audit registry and factory models here."""

from __future__ import annotations

from torch import nn

from cl_audit.enums import Stage
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.execution.inputs import Example
from cl_audit.execution.plan import RunPlan, plan_run
from cl_audit.execution.settings import AuditSettings
from cl_audit.phases.audit_module import audit_module
from cl_audit.report import ModelReport
from cl_audit.rule.attribution import model_failed
from cl_audit.sources.refs import LoadedModel

__all__ = ["audit_loaded", "prepare"]


def prepare(loaded: LoadedModel, plan: RunPlan) -> tuple[nn.Module, Example]:
    """The model in the settings' dtype where the plan runs it, and its input: the factory's
    example (its floating-point tensors in the settings' dtype), else a random input of the
    settings' shape (made into the model's arguments where it takes more than one batch);
    ``ModelFailedError`` at the setup stage otherwise."""
    settings = plan.settings
    dtype = settings.dtype.torch_dtype
    if loaded.example is not None:
        if settings.batch_size is not None or settings.input_size is not None:
            raise UsageError(
                f"{loaded.name}: the factory gives an example input, whose batch and sizes are "
                "its own: drop --batch-size and --input-size"
            )
        try:
            return plan.tensors.place(loaded.module, loaded.example, plan.device, dtype)
        except Exception as e:
            raise model_failed(Stage.SETUP, loaded.name, e) from e
    shape = settings.input_shape(loaded.input_shape)
    if len(shape) not in (4, 5):
        raise UsageError(f"{loaded.name}: input shape {shape} is not 4D or 5D")
    try:
        batch = plan.tensors.random_input(shape, dtype, plan.device, settings.seed)
        made = loaded.arguments or (lambda batch, train: Example((batch,)))
        return plan.tensors.place(
            loaded.module, made(batch, plan.workload.train), plan.device, dtype
        )
    except Exception as e:
        raise model_failed(Stage.SETUP, loaded.name, e) from e


def audit_loaded(loaded: LoadedModel, settings: AuditSettings | RunPlan) -> ModelReport:
    """A built model audited on its example input, or on a random input of the settings'
    shape, dtype and device."""
    plan = settings if isinstance(settings, RunPlan) else plan_run(settings)
    module, example = prepare(loaded, plan)
    first = example.first
    try:
        return audit_module(module, example, plan, name=loaded.name, loss=loaded.loss)
    except ModelFailedError as e:
        about_input = isinstance(e.cause, (RuntimeError, ValueError, IndexError))
        looks_batched = _looks_batched(loaded, plan.settings)
        if e.stage is not Stage.FORWARD or not about_input or not looks_batched:
            raise
        shape = None if first is None else tuple(first.shape)
        hint = (
            f"the factory's input_shape {loaded.input_shape} is per sample and 4 dims are read "
            f"as a clip (C, T, H, W), so the input was {shape}; for images return (C, H, W)"
        )
        raise ModelFailedError(e.stage, e.model, e.cause, hint, site=e.site) from e.cause


def _looks_batched(loaded: LoadedModel, settings: AuditSettings) -> bool:
    """A declared 4-dim shape that failed: most often an image shape given with its batch."""
    shaped = loaded.declared and loaded.example is None
    return shaped and settings.input_size is None and len(loaded.input_shape) == 4
