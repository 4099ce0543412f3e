"""Fake tensors: layouts come from the operators' meta functions, no data is computed.

Parameters and buffers are wrapped as ``FakeTensor``s on the target device and the forward runs
through ``torch.func.functional_call`` under ``FakeTensorMode``, so memory stays small whatever
the model size (sweeps build timm models on the meta device) and ``--device cuda`` works without
a GPU: the verdict is then a prediction from the CUDA meta functions.

Fake mode can disagree with eager execution. ``FAKE_DIVERGENCES`` lists the known cases, measured
on CPU (``scripts/gpu_truth.py --device cpu``, reports/gpu-truth-cpu.json); a sweep's
``--confirm`` re-runs in eager mode every model fake mode flagged, and every model whose fake
findings include one of these ops (a fake regain there can be an eager loss).
"""

from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

__all__ = ["FAKE_DIVERGENCES", "fake_state", "fake_tensor", "new_mode"]

FAKE_DIVERGENCES = {
    "aten.native_group_norm": "fake returns contiguous for channels_last input; eager CPU keeps "
    "channels_last (poolformer*, resnet50_gn, BiT, vit_base_r50)",
    "aten.native_batch_norm": "on NC11 maps fake gives strides (C,1,C,C) where eager CPU gives "
    "(C,1,1,1), which flips a later interpolate (deeplabv3)",
    "aten.hardtanh_backward": "given an NCHW gradient and its channels_last input, fake returns "
    "channels_last where eager CPU returns NCHW (training: an activation before a global pool; "
    "mobilenet_v2)",
    "aten.hardswish_backward": "as hardtanh_backward: fake keeps channels_last where eager CPU "
    "returns NCHW (training: mobilenetv3_large_100, efficientvit_b0)",
    "aten.native_batch_norm_backward": "training: fake returns NCHW where eager CPU keeps "
    "channels_last (efficientnet_b0) and the reverse after maxvit's window reshapes (maxvit_t)",
    "aten.native_group_norm_backward": "training: fake returns NCHW where eager CPU keeps "
    "channels_last (poolformer_s12), as native_group_norm does in the forward",
    "aten.avg_pool2d_backward": "training: fake returns NCHW where eager CPU keeps channels_last "
    "(poolformer_s12)",
}


def new_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True)


def fake_tensor(mode: FakeTensorMode, tensor: torch.Tensor, device: torch.device) -> FakeTensor:
    """A fake copy of ``tensor`` (real or meta) on ``device``, with the same strides."""
    meta = tensor if tensor.is_meta else tensor.to("meta")
    return FakeTensor(mode, meta, device)


def fake_state(
    mode: FakeTensorMode,
    module: nn.Module,
    device: torch.device,
    memory_format: torch.memory_format | None = None,
) -> dict[str, torch.Tensor]:
    """Fake copies of ``module``'s parameters and buffers for ``functional_call``; with
    ``memory_format``, every 4D and 5D tensor is restrided to it first."""

    def restride(tensor: torch.Tensor) -> torch.Tensor:
        if memory_format is None or tensor.dim() not in (4, 5):
            return tensor
        return tensor.to(memory_format=memory_format)

    return {
        name: fake_tensor(mode, restride(tensor), device)
        for name, tensor in (*module.named_parameters(), *module.named_buffers())
    }
