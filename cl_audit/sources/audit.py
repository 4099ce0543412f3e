"""A built model (``LoadedModel``) audited: the model in the settings' dtype on their device,
a random input of their shape, and the one audit path (``cl_audit.run.audit_module``). The CLI,
the sweep worker, bench and the scripts audit registry and factory models through here."""

from __future__ import annotations

import torch
from torch import nn

from cl_audit.enums import Stage, TensorMode
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.report import ModelReport
from cl_audit.run import audit_module
from cl_audit.settings import AuditSettings, resolve_device
from cl_audit.sources import LoadedModel

__all__ = ["audit_loaded", "prepare"]


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
