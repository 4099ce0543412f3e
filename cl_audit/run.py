"""The one path that audits one model: ``(model, inputs, settings) -> ModelReport``.

The Python API (``audit_model``), the CLI, the sweep worker, bench and the scripts all come
here. It converts model and inputs as the settings' strategy says, runs one forward pass in eval
mode under no_grad and the settings' autocast (or one training step, ``cl_audit.training``),
eagerly or on fake tensors, with an audit and a cost ledger, and then the same forward or step
in NCHW: the two ledgers give what channels_last costs and the verdict (``cl_audit.cost``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from cl_audit.attribution import ModuleNames
from cl_audit.audit import Audit, audit, watching
from cl_audit.compat import TORCH_VERSION, fake_tensor, new_fake_mode
from cl_audit.compiled import beside_eager, compiled_layouts
from cl_audit.convert import apply_strategy, input_to_nchw, strategy_input, to_nchw
from cl_audit.cost import compare_ledgers
from cl_audit.differential import CounterpartWatcher, apply_differential
from cl_audit.divergences import CUDA_KERNEL_OVERRIDES, divergence_table
from cl_audit.enums import Amp, DifferentialStatus, Engine, Optimizer, Stage, Strategy, TensorMode
from cl_audit.errors import ModelFailedError
from cl_audit.fake import KernelSourceMode, fake_state
from cl_audit.inputs import Example, example_of
from cl_audit.intercept.ledger import Ledger
from cl_audit.report import AppliedOverride, DifferentialRun, Environment, ModelReport
from cl_audit.report.cost import Gate
from cl_audit.settings import AuditSettings, parse_engine, resolve_device
from cl_audit.timing import Profiler, call_times, copies_by_call, step_timing, timed_ms
from cl_audit.training import Step, training_report

__all__ = ["audit_model", "audit_module"]

_Forward = Callable[[], object]


class _Eager:
    """Runs the model itself; the NCHW run restrides it and converts it back afterwards."""

    def __init__(self, model: nn.Module, example: Example, settings: AuditSettings) -> None:
        self.model, self.example, self.strategy = model, example, settings.strategy
        self.train = settings.train
        self.parameters: tuple[torch.Tensor, ...] = ()
        first = next(example.tensors(), None)
        self.device = None if first is None else str(first.device)

    def trainable(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    def tensor_mode(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def environment(self, environment: Environment) -> Environment:
        return environment

    def converted(self) -> _Forward:
        apply_strategy(self.model, self.strategy)
        example = self.example.map(lambda x: strategy_input(x, self.strategy))
        self.model.train(self.train)
        return lambda: example.call(self.model)

    def nchw(self) -> _Forward:
        to_nchw(self.model)
        example = self.example.map(input_to_nchw)
        return lambda: example.call(self.model)

    def restore(self) -> None:
        apply_strategy(self.model, self.strategy)


class _Fake:
    """Runs ``functional_call`` on fake copies of the parameters; the model is not touched
    beyond the conversion the strategy asks for."""

    def __init__(
        self,
        model: nn.Module,
        example: Example,
        settings: AuditSettings,
        device: torch.device,
    ) -> None:
        self.model, self.example, self._device = model, example, device
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

    def _forward(self, fmt: torch.memory_format | None, example: Example) -> _Forward:
        state = fake_state(self._mode, self.model, self._device, fmt)
        self.parameters = tuple(state.values())
        names = {name for name, _ in self.model.named_parameters()}
        self._trainable = {n: t.requires_grad_(self.train) for n, t in state.items() if n in names}
        fakes = example.map(
            lambda x: fake_tensor(self._mode, x, self._device) if isinstance(x, torch.Tensor) else x
        )
        return lambda: functional_call(self.model, state, fakes.args, dict(fakes.kwargs))

    def converted(self) -> _Forward:
        self.model.train(self.train)
        apply_strategy(self.model, self.strategy)
        return self._forward(None, self.example.map(lambda x: strategy_input(x, self.strategy)))

    def nchw(self) -> _Forward:
        return self._forward(torch.contiguous_format, self.example.map(input_to_nchw))

    def restore(self) -> None:
        """Nothing to undo: the NCHW run used restrided fake copies."""


def audit_module(
    model: nn.Module,
    inputs: tuple[Any, ...] | Example,
    settings: AuditSettings,
    *,
    name: str | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> ModelReport:
    """Audit one forward pass of ``model`` on ``inputs`` (positional arguments, or an
    ``Example`` with keyword arguments too) as ``settings`` say, or with
    ``settings.train`` one training step (forward with gradients, ``loss(output)`` or
    ``training_loss``, backward, optimizer step); then, unless ``settings.differential`` is
    off, the same forward or step once more in NCHW, and the cost of channels_last against it.

    The model is converted in place as the strategy says (channels_last by default) and put in
    eval (or train) mode. A training step is audited after a warm-up step (the optimizer's
    state exists: a steady-state step), in each format: a compared training audit steps the
    optimizer four times. With ``settings.time`` the step is first timed without the audit
    (warm-up, then ``TIMED_STEPS`` steps) and the audited step runs under ``torch.profiler``.
    Raises ``ModelFailedError`` naming the stage when the model fails.
    """
    device = resolve_device(settings.device, settings.tensor_mode, settings.bfloat16)
    label = name or type(model).__name__
    example = example_of(inputs)
    if settings.tensor_mode is TensorMode.FAKE:
        run: _Eager | _Fake = _Fake(model, example, settings, device)
    else:
        run = _Eager(model, example, settings)
    try:
        forward = run.converted()
    except Exception as e:
        raise ModelFailedError(Stage.SETUP, label, e) from e
    first = example.first
    step = Step(settings, run.trainable(), loss)
    ledger = _ledger(settings)
    rounds: tuple[float, ...] = ()
    profiled = 0.0
    try:
        if settings.time:
            rounds = step.timed(forward, device)
        elif settings.train:
            with run.tensor_mode():
                step.run(forward, None)  # a warm-up: the audited step is a steady-state one
        with run.tensor_mode(), _audited(settings, model, run, ledger, device) as (active, prof):
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
        call_times=call_times(prof, device) if settings.time else None,
    )
    environment = run.environment(
        replace(report.environment, autocast=settings.autocast_description)
    )
    report = replace(report, environment=environment)
    if settings.train:
        report = training_report(report, settings.optimizer.value, step.layouts)
    if settings.time:
        report = replace(report, timing=step_timing(report, rounds, profiled, device))
    report = _compared(report, run, model, settings, ledger, loss, device)
    if not settings.compile:
        return report
    try:
        compiled = compiled_layouts(
            model,
            example,
            device=str(device),
            train=settings.train,
            amp=settings.amp,
            strategy=settings.strategy,
            seed=settings.seed,
            force=settings.force_layout_opt,
        )
    except Exception as e:  # the settings refused a torch that cannot capture (UsageError)
        raise ModelFailedError(Stage.COMPILE, label, e) from e
    return replace(report, compiled=beside_eager(compiled, report.offenders))


_COMPARED = (Strategy.CHANNELS_LAST, Strategy.CONV_WEIGHTS)  # strategies run again in NCHW


def _ledger(settings: AuditSettings) -> Ledger | None:
    """A cost ledger when the audit compares with NCHW: the dispatch engine, and a strategy
    that makes the model channels_last (an eager run measures kernel copies)."""
    if not settings.differential or settings.engine is not Engine.DISPATCH:
        return None
    if settings.strategy not in _COMPARED:
        return None
    return Ledger(measured=settings.tensor_mode is TensorMode.EAGER)


@contextlib.contextmanager
def _audited(
    settings: AuditSettings,
    model: nn.Module,
    run: _Eager | _Fake,
    ledger: Ledger | None,
    device: torch.device,
    also: Any = None,
) -> Iterator[tuple[Audit, Any]]:
    """An audit of one run, under the profiler when it times (``--time``) or measures the
    copies inside kernels (an eager ledger); the measured copies enter the ledger on exit."""
    measure = ledger is not None and ledger.measured
    label_calls = settings.time or measure
    profiler: Any = (
        Profiler(device, shapes=measure, times=settings.time)
        if label_calls
        else contextlib.nullcontext()
    )
    with (
        audit(
            settings.engine,
            model=model,
            parameters=run.parameters,
            timeline=settings.timeline,
            training=settings.train,
            label_calls=label_calls,
            ledger=ledger,
            also=also,
        ) as active,
        profiler,
    ):
        yield active, profiler
    if measure:
        ledger.add_measured(*copies_by_call(profiler))


def _compared(
    report: ModelReport,
    run: _Eager | _Fake,
    model: nn.Module,
    settings: AuditSettings,
    ledger: Ledger | None,
    loss: Callable[[Any], torch.Tensor] | None,
    device: torch.device,
) -> ModelReport:
    """The same forward or step in NCHW: its ledger against this run's gives the cost and the
    verdict; an inference forward also classifies the terminal losses (differential.py). The
    patch engine, which sees no aten operation, only classifies."""
    if not settings.differential:
        status = DifferentialRun(DifferentialStatus.SKIPPED, "not asked for")
        return replace(report, differential=status)
    if settings.strategy not in _COMPARED:
        status = DifferentialRun(DifferentialStatus.SKIPPED, "the model's format is the caller's")
        return replace(report, differential=status)
    terminal = tuple(f for f in report.offenders if f.terminal and not settings.train)
    watcher = CounterpartWatcher(ModuleNames(model), terminal) if terminal else None
    if ledger is None and watcher is None:
        return replace(report, differential=DifferentialRun(DifferentialStatus.NOT_NEEDED))
    nchw = None if ledger is None else Ledger(measured=ledger.measured)
    quiet = replace(settings, timeline=False, time=False)
    try:
        forward = run.nchw()
        if nchw is None:
            with torch.no_grad(), settings.autocast(), run.tensor_mode():
                with watching(settings.engine, watcher):
                    forward()
        else:
            step = Step(settings, run.trainable(), loss)
            if settings.train:
                with run.tensor_mode():
                    step.run(forward, None)  # warmed up as the channels_last step was
            with run.tensor_mode(), _audited(quiet, model, run, nchw, device, watcher) as audited:
                step.run(forward, audited[0])
    except Exception as e:
        message = f"the NCHW run failed ({type(e).__name__}: {e}"[:300] + "); no cost weighed"
        failed = DifferentialRun(
            DifferentialStatus.FAILED, message, unaligned=sum(f.terminal for f in terminal)
        )
        return replace(report, differential=failed)
    finally:
        run.restore()
    if watcher is not None:
        report = apply_differential(report, watcher)
    else:
        report = replace(report, differential=DifferentialRun(DifferentialStatus.RAN))
    if ledger is None or nchw is None:  # the patch engine: classified only
        return report
    time_share = None if report.timing is None else report.timing.share
    cost = compare_ledgers(ledger, nchw, settings.gate, time_share)
    return replace(report, cost=cost, summary=replace(report.summary, verdict=cost.verdict))


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
    compile: bool = False,
    force_layout_opt: bool = False,
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
    written and ``fail_bytes``, ``minor`` under that, ``clean`` without any. ``amp``
    (``"bf16"``/``"fp16"``) runs under autocast; ``loss(output)`` replaces the default training
    loss; ``time`` adds ``Timing`` (eager runs only). ``compile`` adds ``compiled``: what
    ``torch.compile``'s Inductor decides about layouts for each graph it would compile, and why
    (``force_layout_opt``: also the decision under Inductor's force switch); the verdict stays
    the eager audit's.
    """
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
        gate=Gate(share=fail_share / 100, bytes=fail_bytes),
        amp=None if amp is None else Amp(amp),
        train=train,
        optimizer=Optimizer(optimizer),
        time=time,
        compile=compile,
        force_layout_opt=force_layout_opt,
    )
    return audit_module(model, example, settings, name=name, loss=loss)
