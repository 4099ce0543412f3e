"""The run plan: an audit's settings resolved once, before any model is built.

``plan_run`` is the one place that resolves the device; the plan then says how tensors are made
(``Tensors``: eager or fake), what runs (``Workload``: one forward or a training step) and with
which engine. Every phase of an audit takes the plan.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

import torch

from cl_audit.compat.compile_run import compile_options_problem
from cl_audit.compat.cuda import cuda_present
from cl_audit.compat.inductor import compile_problem
from cl_audit.enums import Engine, GateOn, TensorMode, Workload
from cl_audit.errors import UsageError
from cl_audit.execution.autocast import autocast_for
from cl_audit.execution.settings import AuditSettings
from cl_audit.execution.tensors import TENSORS, FakeStepTensors, Tensors
from cl_audit.fake.backward import backward_problem
from cl_audit.fake.cuda_probe import fake_cuda_problem
from cl_audit.predict.table_store import choose
from cl_audit.report import AppliedOverride
from cl_audit.report.environment import autocast_name
from cl_audit.report.sections import Conditions

__all__ = ["RunPlan", "plan_run", "resolve_device"]

FAKE_STEP = FakeStepTensors()


@dataclass(frozen=True)
class RunPlan:
    """Settings resolved: ``device`` a ``torch.device`` that can run them."""

    settings: AuditSettings
    device: torch.device
    tensors: Tensors
    workload: Workload

    @property
    def engine(self) -> Engine:
        return self.settings.engine

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The settings' autocast on the plan's device (see ``autocast_for``)."""
        return autocast_for(self.device, self.settings.amp, fake=self.tensors.predicted)

    def conditions(
        self,
        device: str | None,
        dtype: str | None,
        divergences: str | None = None,
        overrides: tuple[AppliedOverride, ...] = (),
    ) -> Conditions:
        """How a run under this plan ran, as its report's environment records it (with a fake
        run's divergence table and the kernel-source overrides it applied)."""
        amp = self.settings.amp
        return Conditions(
            engine=self.engine,
            mode=self.tensors.mode,
            device=device,
            dtype=dtype,
            autocast=None if amp is None else autocast_name(self.device.type, amp.torch_dtype),
            fake_divergences=divergences,
            kernel_overrides=overrides,
        )

    def changed(self, **settings: Any) -> RunPlan:
        """The same plan with other settings that leave device and tensors as they are (a
        bench configuration's strategy and autocast, a quiet NCHW run)."""
        return replace(self, settings=replace(self.settings, **settings))


def plan_run(settings: AuditSettings) -> RunPlan:
    """The plan of ``settings``; ``UsageError`` for a device that cannot run them."""
    device = resolve_device(settings.device, settings.tensor_mode, settings.bfloat16)
    problem = compile_problem() if settings.compile else None
    if problem is None and settings.compile:
        options = settings.compile_options
        problem = compile_options_problem(options.mode, options.backend)
    if problem is not None:
        raise UsageError(problem)
    if settings.gate.on is GateOn.SPEED:
        _check_speed_gate(settings, device, TENSORS[settings.tensor_mode].predicted)
    elif settings.table is not None:
        choose(device.type, settings.compute_dtype, settings.table)  # a bad name fails here
    workload = Workload.TRAINING_STEP if settings.train else Workload.INFERENCE
    tensors = TENSORS[settings.tensor_mode]
    if tensors.predicted and workload.train:
        problem = backward_problem()
        if problem is not None:
            raise UsageError(f"`train` `fake`: {problem}")
        tensors = FAKE_STEP  # the backward node by node: torch's engine needs the device
    return RunPlan(settings, device, tensors, workload)


def _check_speed_gate(settings: AuditSettings, device: torch.device, predicted: bool) -> None:
    """A speed gate needs a speed verdict: the NCHW run, and measured (``time``, eager) or a
    table of the device holding the dtype the operations compute in."""
    if not settings.differential:
        raise UsageError("`gate` speed compares with the NCHW run: keep `differential` on")
    if not settings.strategy.compared:
        raise UsageError(
            f"`gate` speed compares channels_last with NCHW: `convert` {settings.strategy.value} "
            "runs one layout"
        )
    if settings.time and not predicted:
        return
    if settings.compile:
        raise UsageError(
            "`gate` speed with `compile` gates on the compiled step, which only `time` measures "
            "(no table holds Inductor's fused kernels): give `time`, on an eager run"
        )
    if settings.engine is not Engine.DISPATCH:
        raise UsageError(
            "`gate` speed prices the operations the dispatch engine sees: give `engine` dispatch"
        )
    dtype = settings.compute_dtype
    choice = choose(device.type, dtype, settings.table)
    if choice is None or dtype not in choice.table.dtypes():
        what = (
            f"no {device.type} table" if choice is None else f"{choice.table.name} holds no {dtype}"
        )
        raise UsageError(
            f"`gate` speed needs a speed verdict, and {what} to predict one from: give `time` "
            f"to measure it here, or make this machine's table (cl-audit table --device "
            f"{device.type} --dtype {dtype})"
        )


def resolve_device(
    text: str, tensor_mode: TensorMode = TensorMode.EAGER, bfloat16: bool = False
) -> torch.device:
    """A torch device that can run: CUDA must be present for eager runs; fake mode models
    cpu and cuda without either being present, where this torch passes the fake CUDA probe
    (for ``bfloat16`` computation too, when asked)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"`device` {text!r}: not a torch device") from None
    if TENSORS[tensor_mode].predicted:
        if device.type not in ("cpu", "cuda"):
            raise UsageError(f"`device` {text!r}: fake mode models cpu and cuda only")
        problem = fake_cuda_problem(bfloat16) if device.type == "cuda" else None
        if problem is not None:
            raise UsageError(f"`fake` `device` {text}: no honest prediction here: {problem}")
    elif not _available(device.type):
        name = "CUDA" if device.type == "cuda" else device.type
        raise UsageError(f"`device` {text!r}: {name} is not available on this machine")
    return device


def _available(device_type: str) -> bool:
    """Whether this machine runs ``device_type`` eagerly (its torch module says so; for CUDA
    asked so that a sweep's forked workers can still use it)."""
    if device_type == "cpu":
        return True
    if device_type == "cuda":
        return cuda_present()
    if device_type == "mps":
        return torch.backends.mps.is_available()
    is_available = getattr(getattr(torch, device_type, None), "is_available", None)
    return callable(is_available) and bool(is_available())
