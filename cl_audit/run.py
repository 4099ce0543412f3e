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
from torch import nn
from torch.func import functional_call

from cl_audit.attribution import ModuleNames
from cl_audit.audit import audit, watching
from cl_audit.convert import input_to_channels_last, to_channels_last, to_nchw
from cl_audit.differential import CounterpartWatcher, apply_differential, needs_differential
from cl_audit.errors import ModelFailedError, Stage, UsageError
from cl_audit.fake import fake_state, fake_tensor, new_mode
from cl_audit.report import DifferentialRun, DifferentialStatus, ModelReport
from cl_audit.settings import AuditSettings, Engine, Strategy, TensorMode, resolve_device
from cl_audit.sources import LoadedModel

__all__ = ["audit_loaded", "audit_model", "audit_module"]

_Forward = Callable[[], object]


def _nchw_input(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() in (4, 5):
        return value.contiguous()
    return value


class _Eager:
    """Runs the model itself; the NCHW run restrides it and converts it back afterwards."""

    def __init__(self, model: nn.Module, inputs: tuple[Any, ...], strategy: Strategy) -> None:
        self.model, self.inputs, self.strategy = model, inputs, strategy
        self.parameters: tuple[torch.Tensor, ...] = ()
        self.device = next((str(x.device) for x in inputs if isinstance(x, torch.Tensor)), None)

    def tensor_mode(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def converted(self) -> _Forward:
        inputs = self.inputs
        if self.strategy is Strategy.CHANNELS_LAST:
            to_channels_last(self.model)
            inputs = tuple(input_to_channels_last(x) for x in inputs)
        self.model.eval()
        return lambda: self.model(*inputs)

    def nchw(self) -> _Forward:
        to_nchw(self.model)
        inputs = tuple(_nchw_input(x) for x in self.inputs)
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
        strategy: Strategy,
        device: torch.device,
    ) -> None:
        self.model, self.inputs, self.strategy, self._device = model, inputs, strategy, device
        self._mode = new_mode()
        self.parameters: tuple[torch.Tensor, ...] = ()
        self.device = str(device)

    def tensor_mode(self) -> contextlib.AbstractContextManager[object]:
        return self._mode

    def _forward(self, fmt: torch.memory_format | None, inputs: tuple[Any, ...]) -> _Forward:
        state = fake_state(self._mode, self.model, self._device, fmt)
        self.parameters = tuple(state.values())
        fakes = tuple(
            fake_tensor(self._mode, x, self._device) if isinstance(x, torch.Tensor) else x
            for x in inputs
        )
        return lambda: functional_call(self.model, state, fakes)

    def converted(self) -> _Forward:
        self.model.eval()
        if self.strategy is Strategy.CHANNELS_LAST:
            to_channels_last(self.model)
            return self._forward(None, tuple(input_to_channels_last(x) for x in self.inputs))
        return self._forward(None, self.inputs)

    def nchw(self) -> _Forward:
        inputs = tuple(_nchw_input(x) for x in self.inputs)
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
    """Audit one forward pass of ``model`` on ``inputs`` as ``settings`` say.

    The model is converted in place as the strategy says (channels_last by default) and put in
    eval mode. Raises ``ModelFailedError`` (stage setup or forward) when the model fails.
    """
    device = resolve_device(settings.device, settings.tensor_mode)
    label = name or type(model).__name__
    if settings.tensor_mode is TensorMode.FAKE:
        run: _Eager | _Fake = _Fake(model, inputs, settings.strategy, device)
    else:
        run = _Eager(model, inputs, settings.strategy)
    try:
        forward = run.converted()
    except Exception as e:
        raise ModelFailedError(Stage.SETUP, label, e) from e
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    try:
        with (
            torch.no_grad(),
            settings.autocast(),
            run.tensor_mode(),
            audit(
                settings.engine,
                model=model,
                parameters=run.parameters,
                timeline=settings.timeline,
            ) as active,
        ):
            forward()
    except Exception as e:
        raise ModelFailedError(Stage.FORWARD, label, e) from e
    report = active.report(
        model=name,
        input_shape=None if first is None else tuple(first.shape),
        device=run.device,
        dtype=None if first is None else first.dtype,
        mode=settings.tensor_mode,
    )
    return _differential(report, run, model, settings)


def _differential(
    report: ModelReport, run: _Eager | _Fake, model: nn.Module, settings: AuditSettings
) -> ModelReport:
    """Classify the terminal losses against the same forward in NCHW (see differential.py)."""
    if not settings.differential:
        status = DifferentialRun(DifferentialStatus.SKIPPED, "not asked for")
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
        engine=Engine(engine),
        strategy=Strategy.CHANNELS_LAST if convert else Strategy.AS_GIVEN,
        differential=differential,
    )
    return audit_module(model, tuple(inputs), settings, name=name)
