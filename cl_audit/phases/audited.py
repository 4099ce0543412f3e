"""The audited run: the forward or training step in channels_last under the checker (after an
unaudited one; with ``--time``, after each layout's rounds, ``timed.measure``), and what it
saw."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from cl_audit.compat.failures import is_data_dependent_error, is_device_runtime_error
from cl_audit.compat.storage import storage_key
from cl_audit.enums import CallLabels, Engine, Stage
from cl_audit.errors import UsageError
from cl_audit.execution.audit_context import Audit, audit
from cl_audit.execution.plan import RunPlan
from cl_audit.execution.tensors import TensorRun
from cl_audit.execution.timing import (
    Profiler,
    call_times,
    copies_by_call,
    repeated,
    step_timing,
    timed_ms,
)
from cl_audit.execution.training import BoundStep
from cl_audit.intercept.ledger import Ledger
from cl_audit.intercept.observer import Observer
from cl_audit.phases.subject import Audited, Sections, Subject
from cl_audit.phases.timed import measure
from cl_audit.predict.divergences import kernel_copy_table
from cl_audit.report.sections import Training
from cl_audit.report.stages import StageCut, stage_cut
from cl_audit.rule.attribution import model_failed

__all__ = ["Audited", "instrumented", "run_audited"]


def run_audited(subject: Subject, done: Sections) -> Audited:
    """The converted model's forward or step, audited; ``ModelFailedError`` naming the stage
    (and a hint where one is known) when the model fails."""
    plan, run, forward, model = subject.plan, subject.run, subject.forward, subject.model
    label, loss = subject.label, subject.loss
    settings = plan.settings
    step = run.stepper(plan, forward, loss)
    # the page's picture: each operation's stage (``report.stages``), recorded with the timeline
    cut = stage_cut(name for name, _ in model.named_modules()) if settings.timeline else None
    ledger = _ledger(plan, cut)
    measured = measure(plan, model, run.example, loss, label, cut) if settings.time else None
    profiled = 0.0
    try:
        warm = _warm_up(run, step)
        with run.tensor_mode(), instrumented(plan, model, run, ledger) as (active, prof):
            if settings.time:
                profiled = timed_ms(lambda: step.run(active), plan.device)
            else:
                step.run(active)
    except UsageError:
        raise  # what the settings cannot do for this model (the backward names why)
    except Exception as e:
        hint = _hint(plan, run, e)
        if hint is None and _nchw_runs(plan, run, loss):
            hint = "channels_last breaks the model here: the same step runs in NCHW"
        raise model_failed(step.stage, label, e, hint) from e
    if warm is not None:
        stage, error = warm
        hint = "it failed in the unaudited run before the audited one, which then ran"
        raise model_failed(stage, label, error, hint) from error
    observed = active.observed(call_times(prof, plan.device) if settings.time else None)
    training = None
    if plan.workload.train:
        training = Training(settings.optimizer.value, step.layouts)
    timing = None
    if measured is not None:
        timing = step_timing(observed, measured.audited.rounds_ms, profiled, plan.device)
    return Audited(observed, training, timing, ledger, _weights(run, ledger), measured)


def _weights(run: TensorRun, ledger: Ledger | None) -> frozenset[str]:
    """The names of the parameters and buffers that the run's convolutions took as their
    weight (the storages the ledger saw there, the run's own: fake copies in a fake run; valid
    until the model is restrided)."""
    if ledger is None or not ledger.convolution_weights:
        return frozenset()
    keys = ledger.convolution_weights
    return frozenset(n for n, t in run.named_tensors().items() if storage_key(t) in keys)


def _warm_up(run: TensorRun, step: BoundStep) -> tuple[Stage, Exception] | None:
    """The unaudited run before the audited one (``BoundStep.warm_up``: the model's one-time
    work done first). A failure there is returned with its stage, not raised: the audited run
    comes next and, failing too, names the operation, which only an audited run can."""
    try:
        with run.warming():
            step.warm_up()
    except UsageError:
        raise
    except Exception as e:
        return step.stage, e
    return None


def _hint(plan: RunPlan, run: TensorRun, error: Exception) -> str | None:
    if plan.tensors.predicted and is_device_runtime_error(error):
        return (
            f"this operation's {plan.device.type} implementation asks the device runtime before "
            "it computes (a cuDNN or device check), which fake tensors without the device cannot "
            "answer: audit it where the device is, or on --device cpu"
        )
    if plan.tensors.predicted and is_data_dependent_error(error):
        return (
            "the model reads a tensor's values (a branch, an item() or a shape from data), "
            "which fake tensors do not have: audit it eagerly, without --fake"
        )
    first = run.example.first
    if plan.workload.train and first is not None and first.shape[0] < 2:
        return "batch normalisation in train mode needs a batch of at least 2"
    return None


def _nchw_runs(plan: RunPlan, run: TensorRun, loss: Callable[[Any], torch.Tensor] | None) -> bool:
    """Whether the forward or step that failed in channels_last runs in NCHW (strategies that
    make the model channels_last): then channels_last is what breaks it."""
    if not plan.settings.strategy.compared:
        return False
    try:
        step = run.stepper(plan.changed(timeline=False, time=False), run.nchw(), loss)
        with run.tensor_mode():
            step.run(None)
    except Exception:  # the answer: NCHW fails too, so the model's failure is its own
        return False
    finally:
        run.restore()
    return True


def _ledger(plan: RunPlan, cut: StageCut | None) -> Ledger | None:
    """A cost ledger when the audit compares with NCHW: the dispatch engine, and a strategy
    that makes the model channels_last (an eager run measures kernel copies; a predicted one
    reads the copies measured for this torch and device); with a ``cut``, its operations'
    stages too."""
    settings = plan.settings
    if not settings.differential or settings.engine is not Engine.DISPATCH:
        return None
    if not settings.strategy.compared:
        return None
    if not plan.tensors.predicted:
        ledger = Ledger(measured=True)
    else:
        ledger = Ledger(kernel_copies=kernel_copy_table(plan.device.type))
    ledger.times.cut = cut
    return ledger


@contextlib.contextmanager
def instrumented(
    plan: RunPlan,
    model: nn.Module,
    run: TensorRun,
    ledger: Ledger | None,
    also: Observer | None = None,
    findings: bool = True,
) -> Iterator[tuple[Audit, Any]]:
    """An audit of one run, under the profiler when it times (``--time``) or measures the
    copies inside kernels (an eager ledger); the measured copies enter the ledger on exit."""
    settings = plan.settings
    measure = ledger is not None and ledger.measured
    labels = CallLabels.EVERY if settings.time else CallLabels.FIRST if measure else CallLabels.NONE
    profiler: Any = (
        Profiler(plan.device, shapes=measure, times=settings.time)
        if labels is not CallLabels.NONE
        else contextlib.nullcontext()
    )
    with (
        audit(
            settings.engine,
            model=model,
            parameters=run.parameters,
            timeline=settings.timeline,
            training=plan.workload.train,
            label_calls=labels,
            ledger=ledger,
            also=also,
            findings=findings,
        ) as active,
        profiler,
    ):
        yield active, profiler
    if measure:
        ledger.add_measured(*repeated(copies_by_call(profiler), active.repeats))
