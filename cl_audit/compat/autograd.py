"""The training internals: the autograd node a backward runs, what the fake engine's node-by-node
backward reads of a node (its inputs' metadata, its sequence number, whether a Python
``autograd.Function`` made it) and of a tensor (its backward hooks), and the gradient scaler's
kernels (called directly on fake tensors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from cl_audit.compat.versions import missing

__all__ = [
    "amp_unscale_",
    "amp_update_scale_",
    "backward_hooks",
    "current_autograd_node",
    "input_metadata",
    "is_custom_function",
    "missing_node_methods",
    "sequence_nr",
]


_NODE_METHODS = ("_input_metadata", "_sequence_nr")


def missing_node_methods() -> list[str]:
    """What a node of this torch lacks of what a backward run node by node reads."""
    node = (torch.ones(1, requires_grad=True) * 2).grad_fn
    return [f"Node.{name}" for name in _NODE_METHODS if not hasattr(node, name)]


def input_metadata(node: Any) -> Any:
    """The metadata (shape, dtype, device) of each gradient ``node`` takes in."""
    return node._input_metadata


def sequence_nr(node: Any) -> int:
    """``node``'s creation order: a backward runs later nodes first."""
    return node._sequence_nr()


def is_custom_function(node: Any) -> bool:
    """Whether a Python ``autograd.Function`` made ``node``."""
    return isinstance(node, BackwardCFunction)


def backward_hooks(tensor: torch.Tensor) -> Any:
    """The hooks registered on ``tensor`` (``register_hook``), a dict or None."""
    return tensor._backward_hooks


_current_node: Callable[[], object] | None = getattr(torch._C, "_current_autograd_node", None)


def current_autograd_node() -> object | None:
    """The autograd node whose backward is running (it names backward events)."""
    if _current_node is None:
        raise missing("torch._C._current_autograd_node", "a training audit")
    return _current_node()


_unscale = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)


_update_scale = getattr(torch, "_amp_update_scale_", None)


def amp_unscale_(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inverse_scale: torch.Tensor
) -> None:
    """GradScaler's unscale kernel, in place."""
    if _unscale is None:
        raise missing("torch._amp_foreach_non_finite_check_and_unscale_", "fake fp16 training")
    _unscale(grads, found_inf, inverse_scale)


def amp_update_scale_(scale: torch.Tensor, growth: torch.Tensor, found_inf: torch.Tensor) -> None:
    """GradScaler's scale update with its default factors (x2 after 2000 steps, /2 on inf)."""
    if _update_scale is None:
        raise missing("torch._amp_update_scale_", "fake fp16 training")
    _update_scale(scale, growth, found_inf, 2.0, 0.5, 2000)
