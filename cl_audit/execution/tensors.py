"""How an audit makes its tensors: eagerly (the model itself runs on real data) or fake (layouts
from the operators' meta functions, nothing computed: a prediction).

A ``Tensors`` is chosen once, in the run plan. It places a built model and its input, and bound
to a model and its example it is a ``TensorRun``: the channels_last run, the same run in NCHW,
and what undoes the NCHW run's conversion. Nothing else tests which one is in use.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any, ClassVar

import torch
from torch import nn
from torch.func import functional_call

from cl_audit.enums import Strategy, TensorMode
from cl_audit.execution.convert import apply_strategy, input_to_nchw, strategy_input, to_nchw
from cl_audit.execution.inputs import Example
from cl_audit.execution.training import Backward, BoundStep, NodeByNode, Step, StepPlan
from cl_audit.fake.kernels import AttentionKernelMode, KernelSourceMode, fake_state
from cl_audit.fake.mode import fake_tensor, new_fake_mode
from cl_audit.predict.divergences import divergence_table
from cl_audit.report import AppliedOverride

__all__ = ["TENSORS", "EagerTensors", "FakeStepTensors", "FakeTensors", "TensorRun", "Tensors"]

Forward = Callable[[], object]


class TensorRun:
    """One model and its example, bound to a way of making tensors."""

    example: Example
    device: str | None  # as the report names it
    parameters: tuple[torch.Tensor, ...] = ()  # tensors that count as parameters beside the model's

    def trainable(self) -> dict[str, torch.Tensor]:
        """The parameters a training step differentiates and steps."""
        raise NotImplementedError

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The parameters and buffers the latest forward ran with, by name."""
        raise NotImplementedError

    def stepper(
        self, plan: StepPlan, forward: Forward, loss: Callable[[Any], torch.Tensor] | None
    ) -> BoundStep:
        """The step the audit's phases run: the forward, and when training the loss, backward
        and optimizer step."""
        return BoundStep(Step(plan, self.trainable(), loss), forward)

    def tensor_mode(self) -> contextlib.AbstractContextManager[object]:
        """What every run of the model happens under."""
        return contextlib.nullcontext()

    def warming(self) -> contextlib.AbstractContextManager[object]:
        """What an unaudited warm-up runs under: the tensor mode, what its overrides changed not
        counted."""
        return self.tensor_mode()

    def converted(self) -> Forward:
        """The model and input converted as the strategy says, in the workload's mode."""
        raise NotImplementedError

    def nchw(self) -> Forward:
        """The same forward in NCHW: the comparison's run."""
        raise NotImplementedError

    def restore(self) -> None:
        """Undo what ``nchw`` changed."""

    def overrides(self) -> tuple[str | None, tuple[AppliedOverride, ...]]:
        """The divergence table that applies, and the kernel-source overrides applied."""
        return None, ()


class Tensors:
    """A way of making an audit's tensors (see the module docstring)."""

    mode: ClassVar[TensorMode]
    predicted: ClassVar[bool]  # the verdict is a prediction: no kernel ran
    on_meta: ClassVar[bool]  # models are built on the meta device (memory stays small)

    def bind(self, model: nn.Module, example: Example, plan: StepPlan) -> TensorRun:
        """``model`` and its example, to run as ``plan`` says."""
        raise NotImplementedError

    def place(
        self, module: nn.Module, example: Example, device: torch.device, dtype: torch.dtype
    ) -> tuple[nn.Module, Example]:
        """A built model and its example's tensors in ``dtype`` (floating point ones), where
        this way of running wants them."""
        raise NotImplementedError

    def random_input(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int
    ) -> torch.Tensor:
        raise NotImplementedError


def _in_dtype(value: object, dtype: torch.dtype) -> object:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


class _EagerRun(TensorRun):
    """Runs the model itself; the NCHW run restrides it and converts it back afterwards."""

    def __init__(self, model: nn.Module, example: Example, strategy: Strategy, train: bool):
        self.model, self.example, self.strategy, self.train = model, example, strategy, train
        first = example.first
        self.device = None if first is None else str(first.device)

    def trainable(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return dict(chain(self.model.named_parameters(), self.model.named_buffers()))

    def converted(self) -> Forward:
        apply_strategy(self.model, self.strategy)
        example = self.example.map(lambda x: strategy_input(x, self.strategy))
        self.model.train(self.train)
        return lambda: example.call(self.model)

    def nchw(self) -> Forward:
        to_nchw(self.model)
        example = self.example.map(input_to_nchw)
        return lambda: example.call(self.model)

    def restore(self) -> None:
        apply_strategy(self.model, self.strategy)


class EagerTensors(Tensors):
    mode = TensorMode.EAGER
    predicted = False
    on_meta = False

    def bind(self, model: nn.Module, example: Example, plan: StepPlan) -> TensorRun:
        return _EagerRun(model, example, plan.settings.strategy, plan.workload.train)

    def place(
        self, module: nn.Module, example: Example, device: torch.device, dtype: torch.dtype
    ) -> tuple[nn.Module, Example]:
        def place(value: object) -> object:
            value = _in_dtype(value, dtype)
            return value.to(device) if isinstance(value, torch.Tensor) else value

        return module.to(device, dtype), example.map(place)

    def random_input(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int
    ) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=generator, dtype=dtype).to(device)


class _FakeRun(TensorRun):
    """Runs ``functional_call`` on fake copies of the parameters; the model is not touched
    beyond the conversion the strategy asks for. A training step differentiates as
    ``backward`` does, steps the optimizer the target device runs (CUDA: foreach; torch picks
    the for-loop for any fake tensor) and warms up by ``Step.prime``."""

    def __init__(
        self,
        model: nn.Module,
        example: Example,
        device: torch.device,
        strategy: Strategy,
        train: bool,
        backward: type[Backward] = Backward,
    ) -> None:
        self.model, self.example, self._device = model, example, device
        self.strategy, self.train, self._backward = strategy, train, backward
        self._mode = new_fake_mode()
        self._trainable: dict[str, torch.Tensor] = {}
        self._state: dict[str, torch.Tensor] = {}
        self.device = str(device)
        self.kernels = KernelSourceMode.for_device(device)
        self.attention = AttentionKernelMode() if device.type == "cuda" else None

    def trainable(self) -> dict[str, torch.Tensor]:
        """The fake parameters, as leaves that collect gradients when training."""
        return self._trainable

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The fake parameters and buffers of the latest forward."""
        return self._state

    def stepper(
        self, plan: StepPlan, forward: Forward, loss: Callable[[Any], torch.Tensor] | None
    ) -> BoundStep:
        if not self.train:
            return super().stepper(plan, forward, loss)
        foreach = self._device.type == "cuda" or None
        step = Step(plan, self.trainable(), loss, foreach=foreach, backward=self._backward())
        return BoundStep(step, forward, primed=True)

    @contextlib.contextmanager
    def tensor_mode(self) -> Iterator[None]:
        """The fake mode, with the CUDA kernel-source overrides above it and, on CUDA, the
        attention kernel a GPU picks."""
        with self._mode, self.kernels.over(self._mode), self.attention or contextlib.nullcontext():
            yield

    @contextlib.contextmanager
    def warming(self) -> Iterator[None]:
        counters = [self.kernels.applied, *([self.attention.applied] if self.attention else [])]
        kept = [Counter(counter) for counter in counters]
        try:
            with self.tensor_mode():
                yield
        finally:
            for counter, counted in zip(counters, kept, strict=True):
                counter.clear()
                counter.update(counted)

    def overrides(self) -> tuple[str | None, tuple[AppliedOverride, ...]]:
        attention = self.attention.applied_overrides() if self.attention else ()
        applied = (*self.kernels.applied_overrides(), *attention)
        return divergence_table(self._device.type).name, applied

    def _forward(self, fmt: torch.memory_format | None, example: Example) -> Forward:
        state = self._state = fake_state(self._mode, self.model, self._device, fmt)
        self.parameters = tuple(state.values())
        names = {name for name, _ in self.model.named_parameters()}
        self._trainable = {n: t.requires_grad_(self.train) for n, t in state.items() if n in names}
        fakes = example.map(
            lambda x: fake_tensor(self._mode, x, self._device) if isinstance(x, torch.Tensor) else x
        )
        return lambda: functional_call(self.model, state, fakes.args, dict(fakes.kwargs))

    def converted(self) -> Forward:
        self.model.train(self.train)
        apply_strategy(self.model, self.strategy)
        return self._forward(None, self.example.map(lambda x: strategy_input(x, self.strategy)))

    def nchw(self) -> Forward:
        return self._forward(torch.contiguous_format, self.example.map(input_to_nchw))


class FakeTensors(Tensors):
    """Fake tensors; a training step's backward by torch's engine (fake CPU tensors only: the
    fake-step tensors run it node by node, for any device)."""

    mode = TensorMode.FAKE
    predicted = True
    on_meta = True

    def bind(self, model: nn.Module, example: Example, plan: StepPlan) -> TensorRun:
        return _FakeRun(model, example, plan.device, plan.settings.strategy, plan.workload.train)

    def place(
        self, module: nn.Module, example: Example, device: torch.device, dtype: torch.dtype
    ) -> tuple[nn.Module, Example]:
        """The model stays where it was built (the fake run copies its tensors to the
        device)."""
        return module.to(dtype=dtype), example.map(lambda x: _in_dtype(x, dtype))

    def random_input(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int
    ) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")


class FakeStepTensors(FakeTensors):
    """Fake tensors for a training step, its backward run node by node (``NodeByNode``:
    torch's engine needs the device); ``plan_run`` picks them for ``--train --fake``."""

    mode = TensorMode.FAKE_STEP

    def bind(self, model: nn.Module, example: Example, plan: StepPlan) -> TensorRun:
        settings, train = plan.settings, plan.workload.train
        return _FakeRun(model, example, plan.device, settings.strategy, train, NodeByNode)


TENSORS: dict[TensorMode, Tensors] = {
    TensorMode.EAGER: EagerTensors(),
    TensorMode.FAKE: FakeTensors(),
}
