"""The training step an audit runs.

One home for what the CLI (``--train``), the Python API (``audit_model(train=True)``), the sweep
worker, ``cl-audit bench --train`` and the fastai and Lightning callbacks share: the step itself
(forward and loss under autocast, backward with a gradient scaler for fp16, optimizer step),
the loss when the model gives none, the gradients' layouts and the fake scaler.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from cl_audit.compat.autograd import amp_unscale_, amp_update_scale_
from cl_audit.compat.modes import outside_modes, without_torch_function
from cl_audit.enums import Amp, Optimizer, Phase, Stage, Workload
from cl_audit.execution.audit_context import Audit
from cl_audit.execution.settings import AuditSettings
from cl_audit.fake.backward import recording_hooks, run_backward
from cl_audit.fake.mode import fake_like
from cl_audit.report import GradientLayout
from cl_audit.rule.attribution import own_code

__all__ = [
    "LOSS_SITE",
    "Backward",
    "BoundStep",
    "FakeScaler",
    "NodeByNode",
    "Step",
    "StepPlan",
    "gradient_layouts",
    "make_optimizer",
    "training_loss",
]

_Forward = Callable[[], object]
LOSS_SITE = "cl-audit's training loss"  # where the default loss's operations are placed


class StepPlan(Protocol):
    """What a step needs of the run plan (``execution.plan.RunPlan`` is one): the settings, the
    device, the workload, autocast, and whether its tensors are fake (``tensors.predicted``:
    the fake gradient scaler)."""

    settings: AuditSettings
    device: torch.device
    workload: Workload
    tensors: Any

    def autocast(self) -> contextlib.AbstractContextManager[object]: ...


class Backward:
    """How a step differentiates its loss: torch's autograd engine (``loss.backward()``)."""

    def forward(self) -> contextlib.AbstractContextManager[object]:
        """What the forward runs under, for the backward's sake."""
        return contextlib.nullcontext()

    def run(self, loss: torch.Tensor, active: Audit | None) -> None:
        loss.backward()


class NodeByNode(Backward):
    """Fake tensors' backward: the autograd graph's nodes called one by one from Python
    (``cl_audit.fake.backward``), since torch's engine needs the device for a CUDA backward;
    the audit hears which node runs, as torch's engine would tell it; the hooks the forward
    registers on its tensors run."""

    def __init__(self) -> None:
        self._hooks: dict[Any, Any] = {}

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        with recording_hooks() as hooks:
            self._hooks = hooks
            yield

    def run(self, loss: torch.Tensor, active: Audit | None) -> None:
        running = (lambda node: None) if active is None else active.running
        run_backward(loss, running, self._hooks)


class Step:
    """One forward (inference, under no_grad), or one training step: forward and loss under
    autocast, backward (fp16 through a gradient scaler), optimizer step; ``stage`` says how far
    it got. The optimizer and scaler are made once and kept, so repeated steps train on."""

    def __init__(
        self,
        plan: StepPlan,
        parameters: dict[str, torch.Tensor],
        loss: Callable[[Any], torch.Tensor] | None = None,
        foreach: bool | None = None,
        backward: Backward | None = None,
    ) -> None:
        self.plan = plan
        self._foreach = foreach  # the optimizer's implementation, None: torch's default
        self._backward = backward or Backward()
        self.parameters = parameters
        self._loss = loss or (lambda output: training_loss(output, plan.settings.seed))
        self.stage = Stage.FORWARD
        self.layouts: tuple[GradientLayout, ...] = ()
        self.last_loss: torch.Tensor | None = None  # the latest step's loss, before any scaling
        self._optimizer: torch.optim.Optimizer | None = None
        self._scaler: torch.amp.GradScaler | FakeScaler | None = None

    def loss(self, output: object) -> torch.Tensor:
        """The training loss of a forward's output."""
        return self._loss(output)

    def state_tensors(self) -> list[torch.Tensor]:
        """The tensors of the optimizer's and the gradient scaler's state (after a step)."""
        states = () if self._optimizer is None else self._optimizer.state.values()
        found = [v for state in states for v in state.values() if isinstance(v, torch.Tensor)]
        if isinstance(self._scaler, FakeScaler):
            found += self._scaler.tensors()
        return found

    def prime(self) -> None:
        """The optimizer's and the scaler's state made as a first step makes them, by a step on
        zero gradients (no forward, no backward): state tensors take their parameter's layout,
        as a step's gradients do (autograd's layout contract for accumulated gradients). For
        fake parameters (the only ones primed): the step runs on meta copies of them, outside
        the fake mode (a step's state is decided by the parameters' shapes, strides and dtypes;
        meta tensors run it without fake dispatch), one meta parameter for each such signature
        (torch's optimizers make each parameter's state from that parameter alone), and each
        parameter gets fake tensors of its signature's state (``fake_like``, a storage of its
        own each): on its device, or on the CPU where the step made it there (AdamW's step
        count). The scaler is made here, under the fake mode. The meta step is torch's foreach
        implementation (its for-loop makes the same state, one Python call per parameter
        slower); a gradient's values are never read, so it is made empty."""
        self._gradient_scaler()
        optimizer = self._made_optimizer()
        parameters = list(self.parameters.values())
        with outside_modes(), without_torch_function(), torch.no_grad():
            signatures = [(p.shape, p.stride(), p.dtype) for p in parameters]
            metas: dict[tuple[Any, ...], torch.Tensor] = {}
            for shape, strides, dtype in signatures:
                if (shape, strides, dtype) not in metas:
                    meta = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
                    meta.grad = torch.empty_like(meta)
                    metas[shape, strides, dtype] = meta
            first = make_optimizer(self.plan.settings.optimizer, metas.values(), foreach=True)
            first.step()
            for parameter, signature in zip(parameters, signatures, strict=True):
                optimizer.state[parameter] = {
                    key: fake_like(_fresh(value), parameter)
                    if isinstance(value, torch.Tensor)
                    else value
                    for key, value in first.state[metas[signature]].items()
                }

    def run(self, forward: _Forward, active: Audit | None) -> None:
        plan = self.plan
        train = plan.workload.train
        self.stage = Stage.FORWARD
        if active is not None:
            active.enter_phase(Phase.FORWARD)
        grad = torch.enable_grad() if train else torch.no_grad()
        with grad, plan.autocast(), self._backward.forward():
            output = forward()
            self.stage = Stage.LOSS
            loss = self._loss(output) if train else None
        self.last_loss = loss
        if loss is None:
            return
        self.stage = Stage.BACKWARD
        if active is not None:
            active.enter_phase(Phase.BACKWARD)
        scaler = self._gradient_scaler()
        if scaler is not None:
            loss = scaler.scale(loss)
        with without_torch_function():
            for parameter in self.parameters.values():
                parameter.grad = None
        self._backward.run(loss, active)
        self.layouts = gradient_layouts(self.parameters)
        self.stage = Stage.STEP
        if active is not None:
            active.enter_phase(Phase.OPTIMIZER)
        self._step_optimizer()

    def _step_optimizer(self) -> None:
        """The optimizer's step on the gradients there are (fp16: through the scaler)."""
        optimizer = self._made_optimizer()
        scaler = self._gradient_scaler()
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    def _made_optimizer(self) -> torch.optim.Optimizer:
        """The step's optimizer, made on first use and kept."""
        if self._optimizer is None:
            self._optimizer = make_optimizer(
                self.plan.settings.optimizer, self.parameters.values(), self._foreach
            )
        return self._optimizer

    def _gradient_scaler(self) -> torch.amp.GradScaler | FakeScaler | None:
        """The fp16 gradient scaler (made on first use; fake for predicted tensors), else None."""
        plan = self.plan
        if plan.settings.amp is Amp.FP16 and self._scaler is None:
            device = plan.device
            self._scaler = (
                FakeScaler(device) if plan.tensors.predicted else torch.amp.GradScaler(device.type)
            )
        return self._scaler


class BoundStep:
    """A ``Step`` with its forward: what an audit's phases run (``warm_up()``, then
    ``run(active)``). ``primed``: its warm-up makes the optimizer's state by ``Step.prime``
    instead of running whole steps (fake tensors, where a step's only lasting effect is that
    state, laid out as each parameter)."""

    def __init__(self, step: Step, forward: _Forward, primed: bool = False) -> None:
        self.step, self.forward, self._primed = step, forward, primed

    def warm_up(self) -> None:
        """The workload's unaudited steps before the audited one (``Workload.warmup_steps``);
        primed, the optimizer's state and one forward without gradients (the model's one-time
        work)."""
        for _ in range(self.step.plan.workload.warmup_steps):
            if self._primed:
                self.step.prime()
                with torch.no_grad(), self.step.plan.autocast():
                    self.forward()
            else:
                self.run(None)

    @property
    def stage(self) -> Stage:
        return self.step.stage

    @property
    def layouts(self) -> tuple[GradientLayout, ...]:
        return self.step.layouts

    def run(self, active: Audit | None) -> None:
        self.step.run(self.forward, active)


class FakeScaler:
    """``GradScaler``'s arithmetic for fake tensors: the loss scaled, the gradients unscaled in
    place (``_amp_foreach_non_finite_check_and_unscale_``), the scale updated
    (``_amp_update_scale_``), as ``GradScaler`` runs them; but the step always runs, since
    skipping a step with inf/NaN gradients reads data (``found_inf.item()``) that fake tensors
    do not have. ``GradScaler`` itself disables itself on fake CUDA without a GPU."""

    def __init__(self, device: torch.device) -> None:
        self._scale = torch.full((), 2.0**16, dtype=torch.float32, device=device)
        self._growth = torch.zeros((), dtype=torch.int32, device=device)
        self._found_inf = torch.zeros((), dtype=torch.float32, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """Its state: the scale, the growth tracker and the inf/NaN flag."""
        return [self._scale, self._growth, self._found_inf]

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale.to(dtype=loss.dtype)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        with without_torch_function():
            for group in optimizer.param_groups:
                for grad in (p.grad for p in group["params"]):
                    if grad is not None:
                        by_dtype.setdefault(grad.dtype, []).append(grad)
        with torch.no_grad():
            inverse = self._scale.double().reciprocal().float()
            for group in by_dtype.values():
                amp_unscale_(group, self._found_inf, inverse)
        optimizer.step()

    def update(self) -> None:
        amp_update_scale_(self._scale, self._growth, self._found_inf)


_OPTIMIZERS = {
    Optimizer.SGD: lambda params, foreach: torch.optim.SGD(
        params, lr=1e-3, momentum=0.9, foreach=foreach
    ),
    Optimizer.ADAMW: lambda params, foreach: torch.optim.AdamW(params, lr=1e-3, foreach=foreach),
}


def make_optimizer(
    kind: Optimizer, parameters: Iterable[torch.Tensor], foreach: bool | None = None
) -> torch.optim.Optimizer:
    """The optimizer a training audit steps: SGD (lr 1e-3, momentum 0.9) or AdamW (lr 1e-3);
    ``foreach`` as torch takes it (None: torch's default for the parameters' device)."""
    return _OPTIMIZERS[kind](list(parameters), foreach)


def training_loss(output: object, seed: int) -> torch.Tensor:
    """Cross-entropy against random labels for a classifier's (batch, classes) logits; else
    the sum of every floating-point output."""
    with without_torch_function():  # the choice of a loss is no call of the model's
        if isinstance(output, torch.Tensor) and output.dim() == 2 and output.is_floating_point():
            (batch, classes), device = output.shape, output.device
            tensors = None
        else:
            tensors = [t for t in _flat_tensors(output) if t.is_floating_point()]
            tensors = [t for t in tensors if t.requires_grad]
    with own_code(LOSS_SITE):
        if tensors is None:
            generator = torch.Generator().manual_seed(seed)
            labels = torch.randint(classes, (batch,), generator=generator)
            return F.cross_entropy(output.float(), labels.to(device))
        if not tensors:
            raise ValueError("the model's output has no floating-point tensor to take a loss of")
        return torch.stack([t.float().sum() for t in tensors]).sum()


def _fresh(tensor: torch.Tensor) -> torch.Tensor:
    """A meta tensor's shape, strides and dtype on a storage of its own (a real tensor as it
    is: its fake copy gets one)."""
    if not tensor.is_meta:
        return tensor
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")


def _flat_tensors(value: object) -> list[torch.Tensor]:
    """The tensors in an output: nested in lists, tuples, dicts (transformers' and diffusers'
    output objects are dicts) and dataclasses."""
    if isinstance(value, torch.Tensor):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, dict)):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat_tensors(item)]
    return []


def gradient_layouts(parameters: dict[str, torch.Tensor]) -> tuple[GradientLayout, ...]:
    """Parameters whose gradient has other strides than the parameter (size-1 dims aside)."""
    found = []
    with without_torch_function():
        for name, parameter in parameters.items():
            grad = parameter.grad
            if grad is None or grad.numel() < 2 or _order(grad) == _order(parameter):
                continue
            shape, strides = tuple(parameter.shape), parameter.stride()
            found.append(GradientLayout(name, shape, strides, grad.stride()))
    return tuple(found)


def _order(tensor: torch.Tensor) -> tuple[int, ...]:
    """The strides of the dims that are not size 1: what decides the layout."""
    return tuple(st for size, st in zip(tensor.shape, tensor.stride(), strict=True) if size > 1)
