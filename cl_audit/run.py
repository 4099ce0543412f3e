"""Audit one loaded model under the user's settings: device, dtype, autocast, input size."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, unique

import torch

from cl_audit.audit import Engine, audit, channels_last_format, convert_to_channels_last
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.report import ModelReport
from cl_audit.sources import LoadedModel

__all__ = [
    "Amp",
    "DType",
    "RunSettings",
    "audit_loaded",
    "audited_forward",
    "parse_input_size",
    "resolve_device",
]


@unique
class DType(str, Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.value)


@unique
class Amp(str, Enum):
    BF16 = "bf16"
    FP16 = "fp16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self is Amp.BF16 else torch.float16


@dataclass(frozen=True)
class RunSettings:
    batch_size: int = 2
    input_size: tuple[int, ...] | None = None  # per sample; None: the model's own
    device: str = "cpu"
    dtype: DType = DType.FLOAT32
    amp: Amp | None = None
    engine: Engine = Engine.DISPATCH
    seed: int = 0

    def example_shape(self, loaded: LoadedModel) -> tuple[int, ...]:
        """Batch and per-sample shape of the input for ``loaded``; 4D or 5D."""
        shape = (self.batch_size, *(self.input_size or loaded.input_shape))
        if len(shape) not in (4, 5):
            raise UsageError(f"{loaded.name}: input shape {shape} is not 4D or 5D")
        return shape

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager[object]:
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.amp.torch_dtype)

    @property
    def autocast_description(self) -> str | None:
        """As the report writes it, e.g. "cpu:bfloat16"."""
        if self.amp is None:
            return None
        device_type = torch.device(self.device).type
        return f"{device_type}:{str(self.amp.torch_dtype).removeprefix('torch.')}"


def parse_input_size(text: str) -> tuple[int, ...]:
    """``3x224x224`` (images) or ``3x16x112x112`` (clips) to a tuple."""
    try:
        dims = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) not in (3, 4) or min(dims) < 1:
        raise UsageError(f"--input-size {text!r}: expected CxHxW or CxTxHxW, e.g. 3x224x224")
    return dims


def resolve_device(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"--device {text!r}: not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {text!r}: CUDA is not available on this machine")
    return device


def audit_loaded(loaded: LoadedModel, settings: RunSettings) -> ModelReport:
    """Random input, model and input in channels_last, eval mode, no_grad, one forward pass."""
    device = resolve_device(settings.device)
    shape = settings.example_shape(loaded)
    memory_format = channels_last_format(len(shape))
    dtype = settings.dtype.torch_dtype
    try:
        generator = torch.Generator().manual_seed(settings.seed)
        example = torch.randn(shape, generator=generator, dtype=dtype).to(device)
        example = example.contiguous(memory_format=memory_format)
        model = convert_to_channels_last(loaded.module.to(device=device, dtype=dtype)).eval()
    except Exception as e:
        raise ModelFailedError("setup", loaded.name, e) from e
    return audited_forward(loaded.name, settings, model, lambda: model(example), device, shape)


def audited_forward(
    name: str,
    settings: RunSettings,
    model: torch.nn.Module,
    forward: Callable[[], object],
    device: torch.device,
    shape: tuple[int, ...],
    tensor_mode: contextlib.AbstractContextManager[object] | None = None,
) -> ModelReport:
    """Run ``forward`` once under no_grad, the settings' autocast and an audit; ``tensor_mode``
    (a ``FakeTensorMode``) goes beneath the audit and makes the report's mode "fake"."""
    try:
        with (
            torch.no_grad(),
            settings.autocast(device.type),
            tensor_mode or contextlib.nullcontext(),
            audit(settings.engine, model=model) as active,
        ):
            forward()
    except Exception as e:
        raise ModelFailedError("forward", name, e) from e
    return active.report(
        model=name,
        input_shape=shape,
        device=str(device),
        dtype=settings.dtype.value,
        mode="eager" if tensor_mode is None else "fake",
    )
