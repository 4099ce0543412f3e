"""What kind of failure an error is: a fake run refusing data-dependent output, or a device runtime
error."""

from __future__ import annotations

import torch
from torch._subclasses import fake_tensor as _fake

__all__ = ["data_dependent_op", "is_data_dependent_error", "is_device_runtime_error"]


_DEVICE_ERRORS = tuple(
    kind for kind in (getattr(torch, "AcceleratorError", None),) if isinstance(kind, type)
)


_DATA_DEPENDENT = tuple(
    kind
    for kind in (
        getattr(_fake, "DataDependentOutputException", None),
        getattr(_fake, "DynamicOutputShapeException", None),
    )
    if isinstance(kind, type)
)


def is_data_dependent_error(error: BaseException) -> bool:
    """Whether a fake run failed because the model read a tensor's value (a branch on it)."""
    return isinstance(error, _DATA_DEPENDENT)


def data_dependent_op(error: BaseException) -> str | None:
    """The operation whose output depends on tensor values (``aten.nonzero.default``) that a
    fake run refused, found in ``error`` or the exceptions it was raised from; else None."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, _DATA_DEPENDENT):
            return str(seen.func)
        seen = seen.__cause__ or seen.__context__
    return None


def is_device_runtime_error(error: BaseException) -> bool:
    """Whether ``error`` came from a device runtime (torch 2.8 and later raise
    ``torch.AcceleratorError``; earlier releases a RuntimeError saying "CUDA error")."""
    if isinstance(error, _DEVICE_ERRORS):
        return True
    return isinstance(error, RuntimeError) and str(error).startswith(
        ("CUDA error", "Found no NVIDIA driver")
    )
