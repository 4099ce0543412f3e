"""A built model (``LoadedModel``) audited: the model in the settings' dtype on their device,
a random input of their shape, and the one audit path (``cl_audit.run.audit_module``). The CLI,
the sweep worker, bench and the scripts audit registry and factory models through here."""

from __future__ import annotations

import torch
from torch import nn

from cl_audit.enums import Stage, TensorMode
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.inputs import Example
from cl_audit.report import ModelReport
from cl_audit.run import audit_module
from cl_audit.settings import AuditSettings, resolve_device
from cl_audit.sources import LoadedModel

__all__ = ["audit_loaded", "prepare"]


def prepare(loaded: LoadedModel, settings: AuditSettings) -> tuple[nn.Module, Example]:
    """The model in the settings' dtype on their device, and its input: the factory's example
    (its floating-point tensors in the settings' dtype, on their device), else a random input
    of the settings' shape (on the meta device for fake runs); ``ModelFailedError`` at the
    setup stage otherwise."""
    device = resolve_device(settings.device, settings.tensor_mode, settings.bfloat16)
    dtype = settings.dtype.torch_dtype
    if loaded.example is not None:
        if settings.batch_size is not None or settings.input_size is not None:
            raise UsageError(
                f"{loaded.name}: the factory gives an example input, whose batch and sizes are "
                "its own: drop --batch-size and --input-size"
            )
        fake = settings.tensor_mode is TensorMode.FAKE

        def place(value: object) -> object:
            if not isinstance(value, torch.Tensor):
                return value
            value = value.to(dtype) if value.is_floating_point() else value
            return value if fake else value.to(device)

        try:
            module = loaded.module.to(dtype=dtype) if fake else loaded.module.to(device, dtype)
            return module, loaded.example.map(place)
        except Exception as e:
            raise ModelFailedError(Stage.SETUP, loaded.name, e) from e
    shape = settings.input_shape(loaded.input_shape)
    if len(shape) not in (4, 5):
        raise UsageError(f"{loaded.name}: input shape {shape} is not 4D or 5D")
    try:
        if settings.tensor_mode is TensorMode.FAKE:
            meta = torch.empty(shape, dtype=dtype, device="meta")
            return loaded.module.to(dtype=dtype), Example((meta,))
        generator = torch.Generator().manual_seed(settings.seed)
        example = torch.randn(shape, generator=generator, dtype=dtype).to(device)
        return loaded.module.to(device=device, dtype=dtype), Example((example,))
    except Exception as e:
        raise ModelFailedError(Stage.SETUP, loaded.name, e) from e


def audit_loaded(loaded: LoadedModel, settings: AuditSettings) -> ModelReport:
    """A built model audited on its example input, or on a random input of the settings'
    shape, dtype and device."""
    module, example = prepare(loaded, settings)
    first = example.first
    try:
        return audit_module(module, example, settings, name=loaded.name, loss=loaded.loss)
    except ModelFailedError as e:
        about_input = isinstance(e.cause, (RuntimeError, ValueError, IndexError))
        if e.stage is not Stage.FORWARD or not about_input or not _looks_batched(loaded, settings):
            raise
        shape = None if first is None else tuple(first.shape)
        hint = (
            f"the factory's input_shape {loaded.input_shape} is per sample and 4 dims are read "
            f"as a clip (C, T, H, W), so the input was {shape}; for images return (C, H, W)"
        )
        raise ModelFailedError(e.stage, e.model, e.cause, hint) from e.cause


def _looks_batched(loaded: LoadedModel, settings: AuditSettings) -> bool:
    """A declared 4-dim shape that failed: most often an image shape given with its batch."""
    shaped = loaded.declared and loaded.example is None
    return shaped and settings.input_size is None and len(loaded.input_shape) == 4
