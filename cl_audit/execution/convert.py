"""Memory-format conversion of models and inputs, as users apply channels_last.

``to_channels_last`` reproduces ``Module.to(memory_format=torch.channels_last)`` (what fastai,
Composer and PyTorch's tutorial do), rank by rank; ``to_nchw`` undoes it for the NCHW run of a
differential audit. ``apply_strategy`` and ``strategy_input`` put a model and its inputs in
the configuration a ``Strategy`` names (``conv-weights``: torch's own
``convert_conv2d_weight_memory_format`` and its 3D sibling, inputs left NCHW).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils import convert_conv2d_weight_memory_format, convert_conv3d_weight_memory_format

from cl_audit.compat.storage import module_apply
from cl_audit.enums import Strategy

__all__ = [
    "apply_strategy",
    "channels_last_format",
    "input_to_channels_last",
    "input_to_nchw",
    "strategy_input",
    "to_channels_last",
    "to_nchw",
]


def channels_last_format(rank: int) -> torch.memory_format:
    """``channels_last`` for 4D tensors, ``channels_last_3d`` for 5D ones."""
    if rank == 4:
        return torch.channels_last
    if rank == 5:
        return torch.channels_last_3d
    raise ValueError(f"channels_last needs a 4D or 5D input, got {rank}D")


def _restride(module: nn.Module, channels_last: bool) -> nn.Module:
    def convert(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() not in (4, 5):
            return tensor
        target = channels_last_format(tensor.dim()) if channels_last else torch.contiguous_format
        return tensor.to(memory_format=target)

    return module_apply(module, convert)


def to_channels_last(module: nn.Module) -> nn.Module:
    """Parameters and buffers in place: 4D to channels_last, 5D to channels_last_3d.

    ``Module.to(memory_format=...)`` applies one format to every 4D and 5D tensor and fails on
    models that hold both (timm's lambda layers keep a 5D weight in a 2D network). Each tensor
    goes through ``Tensor.to(memory_format=...)`` as there, not ``contiguous()``: for a 1x1
    kernel, ``contiguous`` keeps NCHW strides (it already counts as channels_last), ``to``
    restrides it, and convolutions pick their output format from those strides.
    """
    return _restride(module, channels_last=True)


def to_nchw(module: nn.Module) -> nn.Module:
    """Parameters and buffers in place: every 4D and 5D tensor back to NCHW (NCDHW) strides."""
    return _restride(module, channels_last=False)


def _spatial(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() in (4, 5) and value.is_floating_point()


def input_to_channels_last(value: Any) -> Any:
    """A 4D/5D floating-point tensor copied to channels_last (``channels_last_3d`` for 5D);
    anything else (masks, token ids, timesteps) unchanged."""
    if _spatial(value):
        return value.contiguous(memory_format=channels_last_format(value.dim()))
    return value


def input_to_nchw(value: Any) -> Any:
    """A 4D/5D floating-point tensor copied to NCHW (NCDHW) order; anything else unchanged."""
    if _spatial(value):
        return value.contiguous()
    return value


def apply_strategy(module: nn.Module, strategy: Strategy) -> nn.Module:
    """Parameters and buffers in place, as ``strategy`` says (``AS_GIVEN``: untouched)."""
    if strategy is Strategy.CHANNELS_LAST:
        return to_channels_last(module)
    if strategy is Strategy.NCHW:
        return to_nchw(module)
    if strategy is Strategy.CONV_WEIGHTS:
        to_nchw(module)
        convert_conv2d_weight_memory_format(module, torch.channels_last)
        return convert_conv3d_weight_memory_format(module, torch.channels_last_3d)
    return module


def strategy_input(value: Any, strategy: Strategy) -> Any:
    """An input as ``strategy`` feeds it: channels_last for ``CHANNELS_LAST``, NCHW for
    ``NCHW`` and ``CONV_WEIGHTS``, unchanged for ``AS_GIVEN``."""
    if strategy is Strategy.CHANNELS_LAST:
        return input_to_channels_last(value)
    if strategy in (Strategy.NCHW, Strategy.CONV_WEIGHTS):
        return input_to_nchw(value)
    return value
