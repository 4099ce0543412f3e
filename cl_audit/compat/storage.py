"""A tensor's storage identity and view base, the format kernels allocate in, and ``Module._apply``:
what the recorder and the conversions read of torch's internals."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch._prims_common import suggest_memory_format as _suggest_memory_format

from cl_audit.compat.versions import missing

__all__ = ["module_apply", "storage_key", "suggest_memory_format", "view_base"]


if not hasattr(torch.UntypedStorage, "_cdata"):  # pragma: no cover - no tested torch lacks it
    raise missing("UntypedStorage._cdata", "tracking storage identity")


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of the storage (its StorageImpl address); also works for fake tensors."""
    return tensor.untyped_storage()._cdata


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor a view was taken of, or None for a tensor that owns its data."""
    return tensor._base


def module_apply(module: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """``Module._apply``: every parameter and buffer through ``convert``, in place, as
    ``Module.to`` does (the only way to give each tensor its own memory format)."""
    return module._apply(convert)


def suggest_memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """``Tensor::suggest_memory_format()`` (C++ only): channels_last(_3d) for strides like it,
    else contiguous; the format kernels allocate their outputs in."""
    return _suggest_memory_format(tensor)
