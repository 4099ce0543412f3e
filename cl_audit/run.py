"""The one path that audits one model: ``(model, inputs, settings) -> ModelReport``.

The Python API (``audit_model``), the single-model CLI and the sweep worker all come here. It
converts model and inputs as the settings' strategy says, runs one forward pass in eval mode
under no_grad and the settings' autocast, eagerly or on fake tensors, with an audit, and then,
when a loss is terminal, the same forward in NCHW for the differential verdict.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from cl_audit.attribution import ModuleNames
from cl_audit.audit import Audit, audit, watching
from cl_audit.compat import (
    TORCH_VERSION,
    amp_unscale_,
    amp_update_scale_,
    fake_tensor,
    new_fake_mode,
)
from cl_audit.convert import apply_strategy, input_to_nchw, strategy_input, to_nchw
from cl_audit.differential import CounterpartWatcher, apply_differential, needs_differential
from cl_audit.divergences import CUDA_KERNEL_OVERRIDES, divergence_table
from cl_audit.errors import ModelFailedError, Stage, UsageError
from cl_audit.fake import KernelSourceMode, fake_state
from cl_audit.intercept.dispatch import CALL_LABEL
from cl_audit.report import (
    AppliedOverride,
    DifferentialRun,
    DifferentialStatus,
    Environment,
    GradientLayout,
    ModelReport,
    Phase,
    Timing,
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

__all__ = [
    "TIMED_STEPS",
    "Step",
    "audit_loaded",
    "audit_model",
    "audit_module",
    "gradient_layouts",
    "make_optimizer",
    "prepare",
    "timed_ms",
    "training_loss",
]

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

    def environment(self, environment: Environment) -> Environment:
        return environment

    def converted(self) -> _Forward:
        apply_strategy(self.model, self.strategy)
        inputs = tuple(strategy_input(x, self.strategy) for x in self.inputs)
        self.model.train(self.train)
        return lambda: self.model(*inputs)

    def nchw(self) -> _Forward:
        to_nchw(self.model)
        inputs = tuple(input_to_nchw(x) for x in self.inputs)
        return lambda: self.model(*inputs)

    def restore(self) -> None:
        apply_strategy(self.model, self.strategy)


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
        self._mode = new_fake_mode()
        self.parameters: tuple[torch.Tensor, ...] = ()
        self._trainable: dict[str, torch.Tensor] = {}
        self.device = str(device)
        overrides = tuple(
            o for o in CUDA_KERNEL_OVERRIDES if device.type == "cuda" and o.holds(TORCH_VERSION)
        )
        self.kernels = KernelSourceMode(overrides)

    def trainable(self) -> dict[str, torch.Tensor]:
        """The fake parameters, as leaves that collect gradients when training."""
        return self._trainable

    @contextlib.contextmanager
    def tensor_mode(self) -> Iterator[None]:
        """The fake mode, with the CUDA kernel-source overrides above it."""
        with self._mode, self.kernels:
            yield

    def environment(self, environment: Environment) -> Environment:
        """The divergence table and the kernel-source overrides that this run applied."""
        applied = tuple(
            AppliedOverride(o.op, self.kernels.applied[o.op], o.source)
            for o in CUDA_KERNEL_OVERRIDES
            if self.kernels.applied[o.op]
        )
        table = divergence_table(self._device.type).name
        return replace(environment, fake_divergences=table, kernel_overrides=applied)

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
        apply_strategy(self.model, self.strategy)
        return self._forward(None, tuple(strategy_input(x, self.strategy) for x in self.inputs))

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
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> ModelReport:
    """Audit one forward pass of ``model`` on ``inputs`` as ``settings`` say, or with
    ``settings.train`` one training step (forward with gradients, ``loss(output)`` or
    ``training_loss``, backward, optimizer step).

    The model is converted in place as the strategy says (channels_last by default) and put in
    eval (or train) mode. With ``settings.time`` the step is first timed without the audit
    (warm-up, then ``TIMED_STEPS`` steps) and the audited step runs under ``torch.profiler``.
    Raises ``ModelFailedError`` naming the stage when the model fails.
    """
    _check(settings)
    device = resolve_device(settings.device, settings.tensor_mode, settings.bfloat16)
    label = name or type(model).__name__
    if settings.tensor_mode is TensorMode.FAKE:
        run: _Eager | _Fake = _Fake(model, inputs, settings, device)
    else:
        run = _Eager(model, inputs, settings)
    try:
        forward = run.converted()
    except Exception as e:
        raise ModelFailedError(Stage.SETUP, label, e) from e
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    step = Step(settings, run.trainable(), loss)
    rounds: tuple[float, ...] = ()
    profiled = 0.0
    profiler: Any = contextlib.nullcontext()
    try:
        if settings.time:
            rounds = step.timed(forward, device)
            profiler = _Profiler(device)
        with (
            run.tensor_mode(),
            audit(
                settings.engine,
                model=model,
                parameters=run.parameters,
                timeline=settings.timeline,
                training=settings.train,
                label_calls=settings.time,
            ) as active,
            profiler,
        ):
            if settings.time:
                profiled = timed_ms(lambda: step.run(forward, active), device)
            else:
                step.run(forward, active)
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
        call_times=_call_times(profiler, device) if settings.time else None,
    )
    environment = run.environment(
        replace(report.environment, autocast=settings.autocast_description)
    )
    if settings.train:
        environment = replace(environment, train=True, optimizer=settings.optimizer.value)
    report = replace(report, environment=environment, gradient_layouts=step.layouts)
    report = _differential(report, run, model, settings)
    if settings.time:
        report = replace(report, timing=_timing(report, rounds, profiled, device))
    return report


def _check(settings: AuditSettings) -> None:
    """Refuse combinations that cannot take effect, with the reason."""
    if settings.train and settings.engine is not Engine.DISPATCH:
        raise UsageError("--train needs the dispatch engine: the patch engine cannot see backward")
    fake = settings.tensor_mode is TensorMode.FAKE
    cuda = torch.device(settings.device).type == "cuda"
    if settings.train and fake and cuda and not torch.cuda.is_available():
        raise UsageError(
            "--train --fake --device cuda: autograd's engine needs a CUDA device for the "
            "backward even on fake tensors (no kernel runs); use a machine with a GPU, or "
            "--device cpu"
        )
    if settings.time and fake:
        raise UsageError("--time measures kernels, and fake tensors run none: drop --fake")
    if settings.time and settings.engine is not Engine.DISPATCH:
        raise UsageError("--time needs the dispatch engine (it labels each aten call)")


TIMED_STEPS = 7  # uninstrumented steps timed by --time, after WARMUP_STEPS
WARMUP_STEPS = 2


# Lines that libkineto writes to the process's stderr on its own (profiler start and stop, "no
# GPU" on a CPU machine): dropped; anything else written to stderr meanwhile is passed on.
_KINETO_LINE = re.compile(r"^(USDT|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d [^\]]*\.cpp:\d+\]")


class _Profiler:
    """``torch.profiler.profile`` (CPU, and CUDA kernels on CUDA), with libkineto's own log
    lines kept off the terminal."""

    def __init__(self, device: torch.device) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(activities=activities)
        self._saved = -1
        self._capture: Any = None

    def __enter__(self) -> _Profiler:
        sys.stderr.flush()
        self._capture = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._capture.fileno(), 2)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._profile.__exit__(*exc_info)
            self._profile.events()  # the events are processed (and logged about) here
        finally:
            sys.stderr.flush()
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._capture.seek(0)
            text = self._capture.read().decode(errors="replace")
            self._capture.close()
            kept = [line for line in text.splitlines(keepends=True) if not _KINETO_LINE.match(line)]
            sys.stderr.write("".join(kept))

    def events(self) -> Any:
        return self._profile.events()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(call: Callable[[], object], device: torch.device) -> float:
    """Milliseconds that ``call`` takes, synchronised on CUDA."""
    _synchronize(device)
    start = time.perf_counter()
    call()
    _synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _call_times(profiler: Any, device: torch.device) -> dict[int, float]:
    """Milliseconds by call number, from the profiler ranges the dispatch engine opened:
    CPU time on CPU, the kernels' time on CUDA."""
    times: dict[int, float] = {}
    for event in profiler.events():
        if event.name.startswith(CALL_LABEL):
            micros = event.device_time_total if device.type == "cuda" else event.cpu_time_total
            number = int(event.name[len(CALL_LABEL) :])
            times[number] = times.get(number, 0.0) + micros / 1e3
    return times


def _timing(
    report: ModelReport, rounds: tuple[float, ...], profiled: float, device: torch.device
) -> Timing:
    def total(findings: tuple[Any, ...]) -> float:
        return sum(f.time_ms or 0.0 for f in findings)

    return Timing(
        clock="cuda" if device.type == "cuda" else "cpu",
        threads=torch.get_num_threads(),
        step_ms=statistics.median(rounds),
        rounds_ms=rounds,
        profiled_step_ms=profiled,
        offenders_ms=total(report.offenders),
        regains_ms=total(report.regains),
        parameter_ms=total(report.parameter_conversions),
    )


class Step:
    """One forward (inference, under no_grad), or one training step: forward and loss under
    autocast, backward (fp16 through a gradient scaler), optimizer step; ``stage`` says how far
    it got. The optimizer and scaler are made once and kept, so repeated steps train on."""

    def __init__(
        self,
        settings: AuditSettings,
        parameters: dict[str, torch.Tensor],
        loss: Callable[[Any], torch.Tensor] | None = None,
    ) -> None:
        self.settings = settings
        self.parameters = parameters
        self._loss = loss or (lambda output: training_loss(output, settings.seed))
        self.stage = Stage.FORWARD
        self.layouts: tuple[GradientLayout, ...] = ()
        self._optimizer: torch.optim.Optimizer | None = None
        self._scaler: torch.amp.GradScaler | _FakeScaler | None = None

    def timed(self, forward: _Forward, device: torch.device) -> tuple[float, ...]:
        """Milliseconds of ``TIMED_STEPS`` steps after ``WARMUP_STEPS``, no audit running."""
        for _ in range(WARMUP_STEPS):
            self.run(forward, None)
        return tuple(timed_ms(lambda: self.run(forward, None), device) for _ in range(TIMED_STEPS))

    def run(self, forward: _Forward, active: Audit | None) -> None:
        settings = self.settings
        self.stage = Stage.FORWARD
        if active is not None:
            active.enter_phase(Phase.FORWARD)
        with torch.enable_grad() if settings.train else torch.no_grad(), settings.autocast():
            output = forward()
            loss = self._loss(output) if settings.train else None
        if loss is None:
            return
        self.stage = Stage.BACKWARD
        if active is not None:
            active.enter_phase(Phase.BACKWARD)
        if settings.amp is Amp.FP16 and self._scaler is None:
            fake = settings.tensor_mode is TensorMode.FAKE
            device = torch.device(settings.device)
            self._scaler = _FakeScaler(device) if fake else torch.amp.GradScaler(device.type)
        if self._scaler is not None:
            loss = self._scaler.scale(loss)
        for parameter in self.parameters.values():
            parameter.grad = None
        loss.backward()
        self.layouts = gradient_layouts(self.parameters)
        self.stage = Stage.STEP
        if active is not None:
            active.enter_phase(Phase.OPTIMIZER)
        if self._optimizer is None:
            self._optimizer = make_optimizer(settings.optimizer, self.parameters.values())
        if self._scaler is None:
            self._optimizer.step()
        else:
            self._scaler.step(self._optimizer)
            self._scaler.update()


class _FakeScaler:
    """``GradScaler``'s arithmetic for fake tensors: the loss scaled, the gradients unscaled in
    place (``_amp_foreach_non_finite_check_and_unscale_``), the scale updated
    (``_amp_update_scale_``), as ``GradScaler`` runs them; but the step always runs, since
    skipping a step with inf/NaN gradients reads data (``found_inf.item()``) that fake tensors
    do not have. ``GradScaler`` itself disables itself on fake CUDA without a GPU."""

    def __init__(self, device: torch.device) -> None:
        self._scale = torch.full((), 2.0**16, dtype=torch.float32, device=device)
        self._growth = torch.zeros((), dtype=torch.int32, device=device)
        self._found_inf = torch.zeros((), dtype=torch.float32, device=device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale.to(dtype=loss.dtype)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [p.grad for p in params if p.grad is not None]
        with torch.no_grad():
            inverse = self._scale.double().reciprocal().float()
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for grad in grads:
                by_dtype.setdefault(grad.dtype, []).append(grad)
            for group in by_dtype.values():
                amp_unscale_(group, self._found_inf, inverse)
        optimizer.step()

    def update(self) -> None:
        amp_update_scale_(self._scale, self._growth, self._found_inf)


_OPTIMIZERS = {
    Optimizer.SGD: lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    Optimizer.ADAMW: lambda params: torch.optim.AdamW(params, lr=1e-3),
}


def make_optimizer(kind: Optimizer, parameters: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer a training audit steps: SGD (lr 1e-3, momentum 0.9) or AdamW (lr 1e-3)."""
    return _OPTIMIZERS[kind](list(parameters))


def training_loss(output: object, seed: int) -> torch.Tensor:
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


def gradient_layouts(parameters: dict[str, torch.Tensor]) -> tuple[GradientLayout, ...]:
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
    if settings.strategy not in (Strategy.CHANNELS_LAST, Strategy.CONV_WEIGHTS):
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


def prepare(loaded: LoadedModel, settings: AuditSettings) -> tuple[nn.Module, torch.Tensor]:
    """The model in the settings' dtype on their device, and a random input of their shape
    (on the meta device for fake runs); ``ModelFailedError`` at the setup stage otherwise."""
    shape = settings.input_shape(loaded.input_shape)
    if len(shape) not in (4, 5):
        raise UsageError(f"{loaded.name}: input shape {shape} is not 4D or 5D")
    device = resolve_device(settings.device, settings.tensor_mode, settings.bfloat16)
    dtype = settings.dtype.torch_dtype
    try:
        if settings.tensor_mode is TensorMode.FAKE:
            return loaded.module.to(dtype=dtype), torch.empty(shape, dtype=dtype, device="meta")
        generator = torch.Generator().manual_seed(settings.seed)
        example = torch.randn(shape, generator=generator, dtype=dtype).to(device)
        return loaded.module.to(device=device, dtype=dtype), example
    except Exception as e:
        raise ModelFailedError(Stage.SETUP, loaded.name, e) from e


def audit_loaded(loaded: LoadedModel, settings: AuditSettings) -> ModelReport:
    """A random input of the settings' shape, dtype and device for a built model, audited."""
    module, example = prepare(loaded, settings)
    shape = tuple(example.shape)
    try:
        return audit_module(module, (example,), settings, name=loaded.name, loss=loaded.loss)
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
    convert: bool | Strategy | str = True,
    differential: bool = True,
    train: bool = False,
    amp: Amp | str | None = None,
    optimizer: Optimizer | str = Optimizer.SGD,
    loss: Callable[[Any], torch.Tensor] | None = None,
    time: bool = False,
) -> ModelReport:
    """Audit one eval-mode, no-grad forward pass of ``model``, or with ``train`` one training
    step (train mode, forward and loss, backward, an ``optimizer`` step; see ``training_loss``).

    ``convert``: ``True`` (the default, or ``"channels-last"``) converts the model in place,
    and copies its 4D/5D tensor inputs, to channels_last (``channels_last_3d`` for 5D);
    ``"conv-weights"`` converts only convolution weights; ``False`` audits the model as given.
    ``differential`` runs an inference forward once more in NCHW when a loss is terminal, to
    tell format-neutral ones apart (the model is converted back afterwards). ``amp``
    (``"bf16"``/``"fp16"``) runs under autocast; ``loss(output)`` replaces the default training
    loss; ``time`` adds ``Timing`` (eager runs only).
    """
    inputs = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    if isinstance(convert, bool):
        strategy = Strategy.CHANNELS_LAST if convert else Strategy.AS_GIVEN
    else:
        strategy = Strategy(convert)
    settings = AuditSettings(
        device="cpu" if first is None else str(first.device),
        engine=parse_engine(engine),
        strategy=strategy,
        differential=differential,
        amp=None if amp is None else Amp(amp),
        train=train,
        optimizer=Optimizer(optimizer),
        time=time,
    )
    return audit_module(model, tuple(inputs), settings, name=name, loss=loss)
