"""The one path that audits one model: ``(model, inputs, settings) -> ModelReport``.

The Python API (``audit_model``), the single-model CLI and the sweep worker all come here. It
converts model and inputs as the settings' strategy says, runs one forward pass in eval mode
under no_grad and the settings' autocast, eagerly or on fake tensors, with an audit, and then,
when a loss is terminal, the same forward in NCHW for the differential verdict.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from cl_audit.attribution import ModuleNames
from cl_audit.audit import Audit, audit, watching
from cl_audit.convert import input_to_channels_last, input_to_nchw, to_channels_last, to_nchw
from cl_audit.differential import CounterpartWatcher, apply_differential, needs_differential
from cl_audit.errors import ModelFailedError, Stage, UsageError
from cl_audit.fake import fake_state, fake_tensor, new_mode
from cl_audit.report import (
    DifferentialRun,
    DifferentialStatus,
    GradientLayout,
    ModelReport,
    Phase,
)
from cl_audit.settings import (
    Amp,
    AuditSettings,
    Engine,
    Optimizer,
    Strategy,
    TensorMode,
    parse_engine,
    resolve_device,
)
from cl_audit.sources import LoadedModel

__all__ = ["audit_loaded", "audit_model", "audit_module"]

_Forward = Callable[[], object]


class _Eager:
    """Runs the model itself; the NCHW run restrides it and converts it back afterwards."""

    def __init__(self, model: nn.Module, inputs: tuple[Any, ...], settings: AuditSettings) -> None:
        self.model, self.inputs, self.strategy = model, inputs, settings.strategy
        self.train = settings.train
        self.parameters: tuple[torch.Tensor, ...] = ()
        self.device = next((str(x.device) for x in inputs if isinstance(x, torch.Tensor)), None)

    def trainable(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    def tensor_mode(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def converted(self) -> _Forward:
        inputs = self.inputs
        if self.strategy is Strategy.CHANNELS_LAST:
            to_channels_last(self.model)
            inputs = tuple(input_to_channels_last(x) for x in inputs)
        self.model.train(self.train)
        return lambda: self.model(*inputs)

    def nchw(self) -> _Forward:
        to_nchw(self.model)
        inputs = tuple(input_to_nchw(x) for x in self.inputs)
        return lambda: self.model(*inputs)

    def restore(self) -> None:
        to_channels_last(self.model)


class _Fake:
    """Runs ``functional_call`` on fake copies of the parameters; the model is not touched
    beyond the conversion the strategy asks for."""

    def __init__(
        self,
        model: nn.Module,
        inputs: tuple[Any, ...],
        settings: AuditSettings,
        device: torch.device,
    ) -> None:
        self.model, self.inputs, self._device = model, inputs, device
        self.strategy, self.train = settings.strategy, settings.train
        self._mode = new_mode()
        self.parameters: tuple[torch.Tensor, ...] = ()
        self._trainable: dict[str, torch.Tensor] = {}
        self.device = str(device)

    def trainable(self) -> dict[str, torch.Tensor]:
        """The fake parameters, as leaves that collect gradients when training."""
        return self._trainable

    def tensor_mode(self) -> contextlib.AbstractContextManager[object]:
        return self._mode

    def _forward(self, fmt: torch.memory_format | None, inputs: tuple[Any, ...]) -> _Forward:
        state = fake_state(self._mode, self.model, self._device, fmt)
        self.parameters = tuple(state.values())
        names = {name for name, _ in self.model.named_parameters()}
        self._trainable = {n: t.requires_grad_(self.train) for n, t in state.items() if n in names}
        fakes = tuple(
            fake_tensor(self._mode, x, self._device) if isinstance(x, torch.Tensor) else x
            for x in inputs
        )
        return lambda: functional_call(self.model, state, fakes)

    def converted(self) -> _Forward:
        self.model.train(self.train)
        if self.strategy is Strategy.CHANNELS_LAST:
            to_channels_last(self.model)
            return self._forward(None, tuple(input_to_channels_last(x) for x in self.inputs))
        return self._forward(None, self.inputs)

    def nchw(self) -> _Forward:
        inputs = tuple(input_to_nchw(x) for x in self.inputs)
        return self._forward(torch.contiguous_format, inputs)

    def restore(self) -> None:
        """Nothing to undo: the NCHW run used restrided fake copies."""


def audit_module(
    model: nn.Module,
    inputs: tuple[Any, ...],
    settings: AuditSettings,
    *,
    name: str | None = None,
) -> ModelReport:
    """Audit one forward pass of ``model`` on ``inputs`` as ``settings`` say, or with
    ``settings.train`` one training step (forward with gradients, backward, optimizer step).

    The model is converted in place as the strategy says (channels_last by default) and put in
    eval (or train) mode. Raises ``ModelFailedError`` naming the stage when the model fails.
    """
    device = resolve_device(settings.device, settings.tensor_mode)
    label = name or type(model).__name__
    if settings.train:
        _check_training(settings)
    if settings.tensor_mode is TensorMode.FAKE:
        run: _Eager | _Fake = _Fake(model, inputs, settings, device)
    else:
        run = _Eager(model, inputs, settings)
    try:
        forward = run.converted()
    except Exception as e:
        raise ModelFailedError(Stage.SETUP, label, e) from e
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    step = _Step(settings)
    try:
        with (
            torch.enable_grad() if settings.train else torch.no_grad(),
            run.tensor_mode(),
            audit(
                settings.engine,
                model=model,
                parameters=run.parameters,
                timeline=settings.timeline,
                training=settings.train,
            ) as active,
        ):
            step.run(forward, run.trainable(), active)
    except Exception as e:
        hint = None
        if settings.train and first is not None and first.shape[0] < 2:
            hint = "batch normalisation in train mode needs a batch of at least 2"
        raise ModelFailedError(step.stage, label, e, hint) from e
    report = active.report(
        model=name,
        input_shape=None if first is None else tuple(first.shape),
        device=run.device,
        dtype=None if first is None else first.dtype,
        mode=settings.tensor_mode,
    )
    environment = replace(report.environment, autocast=settings.autocast_description)
    if settings.train:
        environment = replace(environment, train=True, optimizer=settings.optimizer.value)
    report = replace(report, environment=environment, gradient_layouts=step.layouts)
    return _differential(report, run, model, settings)


def _check_training(settings: AuditSettings) -> None:
    if settings.engine is not Engine.DISPATCH:
        raise UsageError("--train needs the dispatch engine: the patch engine cannot see backward")
    if settings.tensor_mode is TensorMode.FAKE and settings.amp is Amp.FP16:
        raise UsageError(
            "--train --fake --amp fp16: the gradient scaler's step reads data (found_inf.item()), "
            "which fake tensors do not have; use --amp bf16, or an eager run"
        )


class _Step:
    """One forward (inference), or one training step: forward and loss under autocast, backward
    (fp16 through a gradient scaler), optimizer step; ``stage`` says how far it got."""

    def __init__(self, settings: AuditSettings) -> None:
        self.settings = settings
        self.stage = Stage.FORWARD
        self.layouts: tuple[GradientLayout, ...] = ()

    def run(self, forward: _Forward, parameters: dict[str, torch.Tensor], active: Audit) -> None:
        settings = self.settings
        with settings.autocast():
            output = forward()
            loss = _loss(output, settings.seed) if settings.train else None
        if loss is None:
            return
        self.stage = Stage.BACKWARD
        active.enter_phase(Phase.BACKWARD)
        scaler = None
        if settings.amp is Amp.FP16:
            scaler = torch.amp.GradScaler(torch.device(settings.device).type)
            loss = scaler.scale(loss)
        loss.backward()
        self.layouts = _gradient_layouts(parameters)
        self.stage = Stage.STEP
        active.enter_phase(Phase.OPTIMIZER)
        optimizer = _OPTIMIZERS[settings.optimizer](parameters.values())
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()


_OPTIMIZERS = {
    Optimizer.SGD: lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    Optimizer.ADAMW: lambda params: torch.optim.AdamW(params, lr=1e-3),
}


def _loss(output: object, seed: int) -> torch.Tensor:
    """Cross-entropy against random labels for a classifier's (batch, classes) logits; else
    the sum of every floating-point output."""
    if isinstance(output, torch.Tensor) and output.dim() == 2 and output.is_floating_point():
        generator = torch.Generator().manual_seed(seed)
        labels = torch.randint(output.shape[1], (output.shape[0],), generator=generator)
        return F.cross_entropy(output.float(), labels.to(output.device))
    tensors = [t for t in _flat_tensors(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise ValueError("the model's output has no floating-point tensor to take a loss of")
    return torch.stack([t.float().sum() for t in tensors]).sum()


def _flat_tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat_tensors(item)]
    return []


def _gradient_layouts(parameters: dict[str, torch.Tensor]) -> tuple[GradientLayout, ...]:
    """Parameters whose gradient has other strides than the parameter (size-1 dims aside)."""
    found = []
    for name, parameter in parameters.items():
        grad = parameter.grad
        if grad is None or grad.numel() < 2 or _order(grad) == _order(parameter):
            continue
        found.append(
            GradientLayout(name, tuple(parameter.shape), parameter.stride(), grad.stride())
        )
    return tuple(found)


def _order(tensor: torch.Tensor) -> tuple[int, ...]:
    """The strides of the dims that are not size 1: what decides the layout."""
    return tuple(st for size, st in zip(tensor.shape, tensor.stride(), strict=True) if size > 1)


def _differential(
    report: ModelReport, run: _Eager | _Fake, model: nn.Module, settings: AuditSettings
) -> ModelReport:
    """Classify the terminal losses against the same forward in NCHW (see differential.py)."""
    if not settings.differential:
        status = DifferentialRun(DifferentialStatus.SKIPPED, "not asked for")
        return replace(report, differential=status)
    if settings.train:
        status = DifferentialRun(DifferentialStatus.SKIPPED, "training steps are not compared yet")
        return replace(report, differential=status)
    if settings.strategy is not Strategy.CHANNELS_LAST:
        status = DifferentialRun(DifferentialStatus.SKIPPED, "the model's format is the caller's")
        return replace(report, differential=status)
    if not needs_differential(report):
        return replace(report, differential=DifferentialRun(DifferentialStatus.NOT_NEEDED))
    terminal = tuple(f for f in report.offenders if f.terminal)
    watcher = CounterpartWatcher(ModuleNames(model), terminal)
    try:
        forward = run.nchw()
        with torch.no_grad(), settings.autocast(), run.tensor_mode():
            with watching(settings.engine, watcher):
                forward()
    except Exception as e:
        message = f"the NCHW run failed ({type(e).__name__}: {e}"[:300] + "); terminal losses "
        failed = DifferentialRun(
            DifferentialStatus.FAILED,
            message + "count as caused",
            unaligned=sum(f.terminal for f in terminal),
        )
        return replace(report, differential=failed)
    finally:
        run.restore()
    return apply_differential(report, watcher)


def audit_loaded(loaded: LoadedModel, settings: AuditSettings) -> ModelReport:
    """A random input of the settings' shape, dtype and device for a built model, audited."""
    shape = settings.input_shape(loaded.input_shape)
    if len(shape) not in (4, 5):
        raise UsageError(f"{loaded.name}: input shape {shape} is not 4D or 5D")
    device = resolve_device(settings.device, settings.tensor_mode)
    dtype = settings.dtype.torch_dtype
    try:
        if settings.tensor_mode is TensorMode.FAKE:
            module = loaded.module.to(dtype=dtype)
            example = torch.empty(shape, dtype=dtype, device="meta")
        else:
            generator = torch.Generator().manual_seed(settings.seed)
            example = torch.randn(shape, generator=generator, dtype=dtype).to(device)
            module = loaded.module.to(device=device, dtype=dtype)
    except Exception as e:
        raise ModelFailedError(Stage.SETUP, loaded.name, e) from e
    try:
        return audit_module(module, (example,), settings, name=loaded.name)
    except ModelFailedError as e:
        if e.stage is not Stage.FORWARD or not _looks_batched(loaded, settings):
            raise
        hint = (
            f"the factory's input_shape {loaded.input_shape} is per sample and 4 dims are read "
            f"as a clip (C, T, H, W), so the input was {shape}; for images return (C, H, W)"
        )
        raise ModelFailedError(e.stage, e.model, e.cause, hint) from e.cause


def _looks_batched(loaded: LoadedModel, settings: AuditSettings) -> bool:
    """A declared 4-dim shape that failed: most often an image shape given with its batch."""
    return loaded.declared and settings.input_size is None and len(loaded.input_shape) == 4


def audit_model(
    model: nn.Module,
    example_input: torch.Tensor | tuple[Any, ...],
    *,
    engine: Engine | str = Engine.DISPATCH,
    name: str | None = None,
    convert: bool = True,
    differential: bool = True,
) -> ModelReport:
    """Audit one eval-mode, no-grad forward pass of ``model``.

    With ``convert`` (the default) the model is converted in place, and its 4D/5D tensor inputs
    copied, to channels_last (``channels_last_3d`` for 5D) first; ``differential`` then runs the
    forward once more in NCHW when a loss is terminal, to tell format-neutral ones apart (the
    model is converted back to channels_last afterwards).
    """
    inputs = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    settings = AuditSettings(
        device="cpu" if first is None else str(first.device),
        engine=parse_engine(engine),
        strategy=Strategy.CHANNELS_LAST if convert else Strategy.AS_GIVEN,
        differential=differential,
    )
    return audit_module(model, tuple(inputs), settings, name=name)
