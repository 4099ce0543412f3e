"""What fake tensors are to cl-audit: torch's fake mode class, ``is_fake``, the device a fake
tensor reports, and the signature of a layer of cl-audit's fake mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses import fake_tensor as _fake

__all__ = ["FakeTensorMode", "Layer", "Run", "device_query", "is_fake"]


FakeTensorMode = _fake.FakeTensorMode


# passes an operation on: (operation, args, kwargs) -> its outputs
Run = Callable[[Any, Any, dict[str, Any]], Any]


# (operation, args, kwargs, run) -> its outputs
Layer = Callable[[Any, Any, dict[str, Any], Run], Any]


_is_fake: Callable[[object], bool] = getattr(
    _fake, "is_fake", lambda t: isinstance(t, _fake.FakeTensor)
)


def is_fake(tensor: object) -> bool:
    return _is_fake(tensor)


_DEVICE = torch.ops.prim.device.default


def device_query(func: Any, args: Any) -> torch.device | None:
    """The device a fake tensor reports for ``prim.device``, or None for any other call.

    C++ asks the device of every fake tensor an operation touches (autograd twice per tensor,
    the optimizer's grouping once), most of a fake training step's dispatches; a mode can answer
    it from the tensor instead of passing it down the stack, as torch's own handler does
    (``_device_handler`` in torch/_subclasses/fake_tensor.py: ``meta`` inside a kernel)."""
    if func is _DEVICE and isinstance(args[0], _fake.FakeTensor):
        return args[0].device
    return None
