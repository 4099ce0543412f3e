"""Fake tensors: layouts come from the operators' meta functions, no data is computed.

Parameters and buffers are wrapped as fake tensors on the target device and the forward runs
through ``torch.func.functional_call`` under a ``FakeTensorMode``, so memory stays small whatever
the model size (sweeps build timm models on the meta device) and ``--device cuda`` works without
a GPU: the verdict is then a prediction from the CUDA meta functions, corrected where the CUDA
kernels' source says they differ (``cl_audit.divergences``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from cl_audit.compat import TORCH_VERSION, FakeTensorMode, TorchDispatchMode, fake_tensor
from cl_audit.divergences import CUDA_KERNEL_OVERRIDES, KernelOverride
from cl_audit.intercept.naming import aten_op_name
from cl_audit.layout import MemoryLayout, layout_of
from cl_audit.report import AppliedOverride

__all__ = ["KernelSourceMode", "fake_state"]


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


class KernelSourceMode(TorchDispatchMode):
    """Below the audit, above the fake mode: gives an overridden operation's output the layout
    its kernel's source says (contiguous) when its first input is channels_last, so the audit
    and the rest of the model see what the real kernel would return. ``applied`` counts them."""

    def __init__(self, overrides: tuple[KernelOverride, ...]) -> None:
        super().__init__()
        self._overrides = {o.op: o for o in overrides}
        self.applied: Counter[str] = Counter()

    @classmethod
    def for_device(cls, device: torch.device) -> KernelSourceMode:
        """The CUDA overrides that hold for this torch, on a CUDA device; none elsewhere."""
        cuda = device.type == "cuda"
        return cls(tuple(o for o in CUDA_KERNEL_OVERRIDES if cuda and o.holds(TORCH_VERSION)))

    def applied_overrides(self) -> tuple[AppliedOverride, ...]:
        """The overrides that changed an operation's output, with how many times."""
        return tuple(
            AppliedOverride(op, self.applied[op], o.source)
            for op, o in self._overrides.items()
            if self.applied[op]
        )

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        override = self._overrides.get(aten_op_name(func))
        if override is None or not args or not isinstance(args[0], torch.Tensor):
            return result
        if layout_of(args[0]) is not MemoryLayout.CHANNELS_LAST:
            return result
        self.applied[override.op] += 1
        if isinstance(result, torch.Tensor):
            return result.contiguous()
        outputs = list(result)
        outputs[override.output] = outputs[override.output].contiguous()
        return type(result)(outputs)
