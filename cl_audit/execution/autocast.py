"""Autocast for a run: ``torch.autocast`` on the plan's device, or on fake CUDA without a GPU the
same state set directly."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from cl_audit.compat.cuda import cuda_present
from cl_audit.enums import Amp

__all__ = ["autocast_for"]


def autocast_for(
    device: torch.device, amp: Amp | None, fake: bool
) -> contextlib.AbstractContextManager[object]:
    """``torch.autocast`` for the device; on fake CUDA without a GPU, the same state set
    directly, since ``torch.autocast("cuda")`` disables itself when CUDA is absent."""
    if amp is None:
        return contextlib.nullcontext()
    device_type = device.type
    if device_type == "cuda" and fake and not cuda_present():
        return _fake_cuda_autocast(amp.torch_dtype)
    return torch.autocast(device_type, dtype=amp.torch_dtype)


@contextlib.contextmanager
def _fake_cuda_autocast(dtype: torch.dtype) -> Iterator[None]:
    """Autocast for fake CUDA tensors on a machine without CUDA: the public switches that
    ``torch.autocast`` uses, restored on exit. A test proves a convolution's output dtype."""
    enabled, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous)
        torch.clear_autocast_cache()
