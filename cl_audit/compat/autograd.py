"""The training internals: the autograd node a backward runs, and the gradient scaler's kernels
(called directly on fake tensors)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cl_audit.compat.versions import missing

__all__ = ["amp_unscale_", "amp_update_scale_", "current_autograd_node"]


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
