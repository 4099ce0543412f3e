"""The one path that audits one model: ``(model, inputs, settings or plan) -> ModelReport``.

The Python API (``audit_model``), the CLI, the sweep worker, bench and the scripts all come
here. The settings are resolved once into a run plan (``execution.plan``); its phases run in
turn, each returning its section: the audited run in channels_last (``phases.audited``), the same
forward or step in NCHW (``phases.compare``: the cost and the verdict) and, with ``compile``,
Inductor's decisions (``phases.compile``); ``execution.assemble`` builds the report from them.
The model leaves as it came in, but for its memory format (converted in place).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain
from typing import Any

import torch
from torch import nn

from cl_audit.enums import Amp, Engine, Optimizer, Stage, Strategy
from cl_audit.errors import UsageError
from cl_audit.execution.assemble import assemble
from cl_audit.execution.inputs import Example, example_of
from cl_audit.execution.plan import RunPlan, plan_run
from cl_audit.execution.settings import AuditSettings, CompileOptions, parse_engine
from cl_audit.execution.tensors import TensorRun
from cl_audit.intercept.ledger import Ledger
from cl_audit.phases import PHASES, Sections, Subject
from cl_audit.report import ModelReport
from cl_audit.report.environment import dtype_name
from cl_audit.report.verdict import GATE_BATCH, Gate
from cl_audit.rule.attribution import model_failed

__all__ = ["audit_model", "audit_module", "operations"]


def audit_module(
    model: nn.Module,
    inputs: tuple[Any, ...] | Example,
    settings: AuditSettings | RunPlan,
    *,
    name: str | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> ModelReport:
    """Audit one forward pass of ``model`` on ``inputs`` (positional arguments, or an
    ``Example`` with keyword arguments too) as ``settings`` (or their plan) say, or with a
    training workload one training step (forward with gradients, ``loss(output)`` or
    ``training_loss``, backward, optimizer step); then, unless ``differential`` is off, the
    same forward or step once more in NCHW, and the cost of channels_last against it.

    The model is converted in place as the strategy says (channels_last by default) and run in
    eval (or train) mode; afterwards its modes, parameters, buffers and gradients are as they
    came in (``as_it_came``). Each run is audited after an unaudited one in its format (work
    the model does once is not charged to the format that runs first); a training step so in
    the steady state (the optimizer's state exists). With ``time`` the step is first timed
    without the audit and the audited step runs under ``torch.profiler``. Raises
    ``ModelFailedError`` naming the stage when the model fails.
    """
    plan = settings if isinstance(settings, RunPlan) else plan_run(settings)
    example = example_of(inputs)
    first = example.first
    run, done = _phases(model, example, plan, name or type(model).__name__, loss, PHASES)
    audited, compared = done.audited, done.comparison
    assert audited is not None and compared is not None
    comparison = compared.comparison
    dtype = None if first is None else dtype_name(first.dtype)
    return assemble(
        audited.observed,
        plan.conditions(run.device, dtype, *run.overrides()),
        model=name,
        input_shape=None if first is None else tuple(first.shape),
        differential=comparison.differential,
        training=audited.training,
        timing=audited.timing,
        comparison=comparison,
        compiled=done.compiled,
        speed=done.speed,
    )


def operations(
    model: nn.Module, inputs: tuple[Any, ...] | Example, settings: AuditSettings | RunPlan
) -> tuple[Ledger, Ledger]:
    """The cost ledgers of an audit of ``model``, in channels_last and in NCHW, with the
    operations the speed prediction prices (``cl-audit table --for`` measures them first); the
    audit's first two phases alone (``differential`` must be on)."""
    plan = settings if isinstance(settings, RunPlan) else plan_run(settings)
    _, done = _phases(model, example_of(inputs), plan, type(model).__name__, None, PHASES[:2])
    audited, compared = done.audited, done.comparison
    if audited is None or compared is None or audited.ledger is None or compared.ledger is None:
        raise UsageError("the operations of a run need its NCHW comparison: keep `differential`")
    return audited.ledger, compared.ledger


def _phases(
    model: nn.Module,
    example: Example,
    plan: RunPlan,
    label: str,
    loss: Callable[[Any], torch.Tensor] | None,
    phases: tuple[tuple[str, Callable[[Subject, Sections], Any]], ...],
) -> tuple[TensorRun, Sections]:
    """``phases`` run in turn on the model bound to the plan's tensors, and what they returned;
    the model as it came in afterwards (``as_it_came``)."""
    with as_it_came(model, plan.workload.train):
        run = plan.tensors.bind(model, example, plan)
        try:
            forward = run.converted()
        except Exception as e:
            raise model_failed(Stage.SETUP, label, e) from e
        subject = Subject(plan, run, model, forward, label, loss)
        done = Sections()
        for section, phase in phases:
            done = replace(done, **{section: phase(subject, done)})
    return run, done


@contextlib.contextmanager
def as_it_came(model: nn.Module, train: bool) -> Iterator[None]:
    """Every module's train/eval mode and its own parameters and buffers (the same tensors: a
    fake run's functional call can leave fake copies on a module shared under two names) back
    as they were; with ``train``, their values and the gradients too: the values are copied
    aside first and back afterwards (memory: one more copy of the parameters and buffers; the
    copy back keeps the strides the audit converted them to)."""
    modes = [(module, module.training) for module in model.modules()]
    held = [  # every module's own tensors: a fake run may leave copies on a shared module
        (module, name, tensor)
        for module in model.modules()
        for name, tensor in chain(
            module.named_parameters(recurse=False), module.named_buffers(recurse=False)
        )
    ]
    values: list[tuple[torch.Tensor, torch.Tensor]] = []
    grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    if train:
        with torch.no_grad():
            values = [(tensor, tensor.detach().clone()) for _, _, tensor in held]
        grads = [(t, t.grad) for _, _, t in held if isinstance(t, nn.Parameter)]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
        for module, name, tensor in held:
            if getattr(module, name) is not tensor:
                setattr(module, name, tensor)
        with torch.no_grad():
            for tensor, value in values:
                tensor.copy_(value)
        for parameter, grad in grads:
            parameter.grad = grad


def audit_model(
    model: nn.Module,
    example_input: torch.Tensor | tuple[Any, ...] | dict[str, Any],
    *,
    engine: Engine | str = Engine.DISPATCH,
    name: str | None = None,
    convert: bool | Strategy | str = True,
    differential: bool = True,
    train: bool = False,
    amp: Amp | str | None = None,
    optimizer: Optimizer | str = Optimizer.SGD,
    loss: Callable[[Any], torch.Tensor] | None = None,
    time: bool = False,
    fail_share: float = 100 * Gate.share,
    fail_bytes: int = Gate.bytes,
    gate_batch: int | None = GATE_BATCH,
    compile: bool = False,
    force_layout_opt: bool = False,
    compile_options: CompileOptions | None = None,
    verify: bool = True,
) -> ModelReport:
    """Audit one eval-mode, no-grad forward pass of ``model``, or with ``train`` one training
    step (train mode, forward and loss, backward, an ``optimizer`` step; see ``training_loss``).

    ``example_input``: a tensor, a tuple of positional arguments, or a dict of keyword
    arguments (tensors and other values: timesteps, token ids, masks are passed as given).
    ``convert``: ``True`` (the default, or ``"channels-last"``) converts the model in place,
    and copies its 4D/5D floating-point tensor inputs, to channels_last (``channels_last_3d``
    for 5D);
    ``"conv-weights"`` converts only convolution weights; ``False`` audits the model as given.
    ``differential`` runs the forward or step once more in NCHW and weighs the cost of
    channels_last against it (the model is converted back afterwards): the verdict is
    ``offending`` when the channels_last-only bytes reach ``fail_share`` percent of the bytes
    written and ``fail_bytes`` at batch ``gate_batch`` (projected from the example's: bytes paid
    once per forward or step kept, the rest scaled; None: at the example's batch), ``minor``
    under that, ``clean`` without any. ``amp``
    (``"bf16"``/``"fp16"``) runs under autocast; ``loss(output)`` replaces the default training
    loss; ``time`` adds ``Timing`` (eager runs only). ``compile`` adds ``compiled``: what
    ``torch.compile``'s Inductor decides about layouts for each graph it would compile, and why
    (``force_layout_opt``: also the decision under Inductor's force switch); the verdict stays
    the eager audit's; with ``time`` too, both layouts are compiled (``compile_options``:
    torch.compile's mode, backend, dynamic) and timed: ``speed.compiled``. ``verify`` tries the
    remedies of the costliest sites in what-if runs
    (an eager forward or training step; ``cl_audit.phases.verify``): each remedy says
    whether it was verified, refuted or is a lead, with the evidence.
    """
    if not isinstance(model, nn.Module):
        made = (
            " (a factory? call it: audit_model(factory(), example_input))"
            if callable(model)
            else ""
        )
        raise TypeError(f"audit_model audits an nn.Module, not a {type(model).__name__}{made}")
    example = example_of(example_input)
    first = example.first
    if isinstance(convert, bool):
        strategy = Strategy.CHANNELS_LAST if convert else Strategy.AS_GIVEN
    else:
        strategy = Strategy(convert)
    settings = AuditSettings(
        device="cpu" if first is None else str(first.device),
        engine=parse_engine(engine),
        strategy=strategy,
        differential=differential,
        gate=Gate.of(fail_share, fail_bytes, gate_batch),
        amp=None if amp is None else Amp(amp),
        train=train,
        optimizer=Optimizer(optimizer),
        time=time,
        compile=compile,
        force_layout_opt=force_layout_opt,
        compile_options=compile_options or CompileOptions(),
        verify=verify,
    )
    return audit_module(model, example, settings, name=name, loss=loss)
