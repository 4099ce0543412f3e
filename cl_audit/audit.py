"""The public API: ``audit()`` as a context manager and ``audit_model()`` for one forward pass."""

from __future__ import annotations

import platform
import threading
from enum import Enum, unique
from importlib import metadata
from typing import Any

import torch
from torch import nn

from cl_audit.attribution import ModuleNames
from cl_audit.errors import AuditError
from cl_audit.intercept.dispatch import DispatchEngine
from cl_audit.intercept.patch import PatchEngine
from cl_audit.intercept.recorder import Recorder
from cl_audit.report import Environment, ModelReport

__all__ = [
    "Audit",
    "Engine",
    "audit",
    "audit_model",
    "channels_last_format",
    "convert_to_channels_last",
    "tool_environment",
]


@unique
class Engine(str, Enum):
    DISPATCH = "dispatch"
    PATCH = "patch"


_ENGINES = {Engine.DISPATCH: DispatchEngine, Engine.PATCH: PatchEngine}
_active_lock = threading.Lock()
_active: Audit | None = None


def _distribution_version(name: str) -> str | None:
    """Installed version without importing the package (importing timm costs seconds)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _autocast_in_effect() -> str | None:
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            return f"{device_type}:{str(dtype).removeprefix('torch.')}"
    return None


def tool_environment(
    *, device: str | None, dtype: str | None, autocast: str | None, engine: str, mode: str
) -> Environment:
    """Versions of the tool and its libraries, with the settings of an audit."""
    return Environment(
        tool=_distribution_version("cl-audit") or "unknown",
        python=platform.python_version(),
        torch=torch.__version__,
        torchvision=_distribution_version("torchvision"),
        timm=_distribution_version("timm"),
        device=device,
        dtype=dtype,
        autocast=autocast,
        engine=engine,
        mode=mode,
    )


def convert_to_channels_last(module: nn.Module) -> nn.Module:
    """Parameters and buffers in place: 4D to channels_last, 5D to channels_last_3d.

    ``Module.to(memory_format=...)`` applies one format to every 4D and 5D tensor and fails on
    models that hold both (timm's lambda layers keep a 5D weight in a 2D network). Each tensor
    goes through ``Tensor.to(memory_format=...)`` as there, not ``contiguous()``: for a 1x1
    kernel, ``contiguous`` keeps NCHW strides (it already counts as channels_last), ``to``
    restrides it, and convolutions pick their output format from those strides.
    """

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() not in (4, 5):
            return tensor
        return tensor.to(memory_format=channels_last_format(tensor.dim()))

    return module._apply(convert)


def channels_last_format(rank: int) -> torch.memory_format:
    """``channels_last`` for 4D tensors, ``channels_last_3d`` for 5D ones."""
    if rank == 4:
        return torch.channels_last
    if rank == 5:
        return torch.channels_last_3d
    raise ValueError(f"channels_last needs a 4D or 5D input, got {rank}D")


class Audit:
    """Checks every torch operation run inside ``with`` and builds a report afterwards.

    Audits do not nest: entering one while another is active raises ``AuditError``. Whatever
    happens inside, torch is restored on exit. Nothing is printed: render ``report()`` yourself.
    """

    def __init__(self, engine: Engine | str = Engine.DISPATCH, model: nn.Module | None = None):
        try:
            self.engine = Engine(engine)
        except ValueError:
            choices = ", ".join(e.value for e in Engine)
            raise ValueError(f"unknown engine {engine!r}; choose one of: {choices}") from None
        self._recorder = Recorder(ModuleNames(model))
        self._impl = _ENGINES[self.engine](self._recorder)
        self._entered = False
        self._autocast: str | None = None

    def __enter__(self) -> Audit:
        global _active
        with _active_lock:
            if self._entered:
                raise AuditError("this audit was already used; create a new one")
            if _active is not None:
                raise AuditError("an audit is already active; cl-audit audits cannot be nested")
            self._entered = True
            _active = self
        try:
            self._autocast = _autocast_in_effect()
            self._impl.install()
        except BaseException:
            with _active_lock:
                _active = None
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        global _active
        try:
            self._impl.uninstall()
        finally:
            with _active_lock:
                _active = None

    def report(
        self,
        *,
        model: str | None = None,
        input_shape: tuple[int, ...] | None = None,
        device: str | None = None,
        dtype: str | None = None,
        mode: str = "eager",
    ) -> ModelReport:
        """The findings so far. Device and dtype default to those of the first 4D/5D input seen;
        ``mode`` is "fake" when the tensors were fake."""
        if not self._entered:
            raise AuditError("nothing audited yet: run the model inside 'with audit:' first")
        seen_device, seen_dtype = self._recorder.first_spatial or (None, None)
        losses, regains = self._recorder.findings()
        environment = tool_environment(
            device=device or seen_device,
            dtype=dtype or seen_dtype,
            autocast=self._autocast,
            engine=self.engine.value,
            mode=mode,
        )
        return ModelReport(
            model=model,
            input_shape=input_shape,
            environment=environment,
            summary=self._recorder.summary(losses, regains),
            offenders=tuple(losses),
            regains=tuple(regains),
            unwrapped=self._impl.unwrapped,
        )


def audit(engine: Engine | str = Engine.DISPATCH, *, model: nn.Module | None = None) -> Audit:
    """``with cl_audit.audit() as a: model(x)`` then ``a.report()``.

    Passing ``model`` names modules from it; without it they are learned from the call stack.
    """
    return Audit(engine, model)


def audit_model(
    model: nn.Module,
    example_input: torch.Tensor | tuple[Any, ...],
    *,
    engine: Engine | str = Engine.DISPATCH,
    name: str | None = None,
    convert: bool = True,
) -> ModelReport:
    """Audit one eval-mode, no-grad forward pass of ``model``.

    With ``convert`` (the default) the model is converted in place, and its 4D/5D tensor inputs
    copied, to channels_last (``channels_last_3d`` for 5D) first.
    """
    inputs = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    if convert:
        inputs = tuple(_to_channels_last(x) for x in inputs)
        convert_to_channels_last(model)
    model.eval()
    first = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
    with torch.no_grad(), audit(engine, model=model) as active:
        model(*inputs)
    return active.report(
        model=name,
        input_shape=None if first is None else tuple(first.shape),
        device=None if first is None else str(first.device),
        dtype=None if first is None else str(first.dtype).removeprefix("torch."),
    )


def _to_channels_last(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() in (4, 5):
        return value.contiguous(memory_format=channels_last_format(value.dim()))
    return value
