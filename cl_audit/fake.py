"""Fake-tensor audits: layouts come from the operators' meta functions, no data is computed.

The model is built on the meta device (or, for user factories, normally), every parameter and
buffer is wrapped as a ``FakeTensor`` on the target device, and the forward runs through
``torch.func.functional_call`` under ``FakeTensorMode``. Memory stays small whatever the model
size, and ``--device cuda`` works without a GPU: the verdict is then a prediction from the CUDA
meta functions, labelled ``predicted``.

Fake mode can disagree with eager execution. ``FAKE_DIVERGENCES`` lists the known cases, measured
on CPU; a sweep's ``--confirm`` re-runs in eager mode every model fake mode flagged.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.func import functional_call

from cl_audit.audit import channels_last_format, convert_to_channels_last
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.report import ModelReport
from cl_audit.run import RunSettings, audited_forward
from cl_audit.sources import LoadedModel

__all__ = ["FAKE_DIVERGENCES", "audit_fake"]

FAKE_DIVERGENCES = {
    "aten.native_group_norm": "fake returns contiguous for channels_last input; eager CPU keeps "
    "channels_last (poolformer*, resnet50_gn, BiT, vit_base_r50)",
    "aten.native_batch_norm": "on NC11 maps fake gives strides (C,1,C,C) where eager CPU gives "
    "(C,1,1,1), which flips a later interpolate (deeplabv3)",
}


def _fake(mode: FakeTensorMode, tensor: torch.Tensor, device: torch.device) -> FakeTensor:
    meta = tensor if tensor.is_meta else tensor.to("meta")
    return FakeTensor(mode, meta, device)


def audit_fake(loaded: LoadedModel, settings: RunSettings) -> ModelReport:
    """One forward pass of ``loaded`` on fake tensors, audited with ``settings``."""
    device = torch.device(settings.device)
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {settings.device!r}: fake mode models cpu and cuda only")
    shape = settings.example_shape(loaded)
    memory_format = channels_last_format(len(shape))
    dtype = settings.dtype.torch_dtype
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        model = convert_to_channels_last(loaded.module.to(dtype=dtype)).eval()
        state = {
            name: _fake(mode, tensor, device)
            for name, tensor in (*model.named_parameters(), *model.named_buffers())
        }
        meta_input = torch.empty(shape, dtype=dtype, device="meta")
        example = _fake(mode, meta_input.contiguous(memory_format=memory_format), device)
    except Exception as e:
        raise ModelFailedError("setup", loaded.name, e) from e
    forward = lambda: functional_call(model, state, (example,))  # noqa: E731
    return audited_forward(loaded.name, settings, model, forward, device, shape, mode)
