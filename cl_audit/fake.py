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

from cl_audit.compat import (
    TORCH_VERSION,
    FakeTensorMode,
    TorchDispatchMode,
    fake_tensor,
)
from cl_audit.divergences import (
    BATCH_NORM_BACKWARD_SOURCE,
    CUDA_KERNEL_OVERRIDES,
    KernelOverride,
)
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
    its kernel's source says, so the audit and the rest of the model see what the real kernel
    would return: contiguous for a ``KernelOverride`` whose first input is channels_last; as
    cuDNN lays out a training batch norm's input gradient. ``applied`` counts them."""

    def __init__(
        self,
        overrides: tuple[KernelOverride, ...],
        cudnn_batch_norm: bool = False,
    ) -> None:
        super().__init__()
        self._overrides = {o.op: o for o in overrides}
        self._sources = {o.op: o.source for o in overrides}
        if cudnn_batch_norm:
            self._sources[_BATCH_NORM_BACKWARD] = BATCH_NORM_BACKWARD_SOURCE
            self._sources[_CUDNN_BATCH_NORM_BACKWARD] = BATCH_NORM_BACKWARD_SOURCE
        self.applied: Counter[str] = Counter()

    @classmethod
    def for_device(cls, device: torch.device) -> KernelSourceMode:
        """The CUDA overrides that hold for this torch, on a CUDA device; none elsewhere."""
        if device.type != "cuda":
            return cls(())
        holding = tuple(o for o in CUDA_KERNEL_OVERRIDES if o.holds(TORCH_VERSION))
        return cls(holding, cudnn_batch_norm=True)

    def applied_overrides(self) -> tuple[AppliedOverride, ...]:
        """The overrides that changed an operation's output, with how many times."""
        return tuple(
            AppliedOverride(op, self.applied[op], source)
            for op, source in self._sources.items()
            if self.applied[op]
        )

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        name = aten_op_name(func)
        if name in (_BATCH_NORM_BACKWARD, _CUDNN_BATCH_NORM_BACKWARD) and name in self._sources:
            return self._cudnn_batch_norm_gradient(name, args, result)
        override = self._overrides.get(name)
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

    def _cudnn_batch_norm_gradient(self, name: str, args: Any, result: Any) -> Any:
        """The input gradient of a training batch norm that cuDNN runs, laid out as its input
        (``BATCH_NORM_BACKWARD_SOURCE``): ``cudnn_batch_norm_backward`` (a forward traced on
        CUDA), or the native one where cuDNN would take it; any other is left as is."""
        if name == _CUDNN_BATCH_NORM_BACKWARD:
            data, weight, train = args[0], args[2], True
        else:
            data, weight, train = args[1], args[2], len(args) > 7 and args[7]
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(data.dim())
        grad_input = result[0]
        if fmt is None or grad_input is None or weight is None or not train:
            return result
        if not data.is_contiguous(memory_format=fmt) or data.is_contiguous():
            return result  # NCHW, or either (the layout is not decided by it)
        half, bf16 = torch.float16, torch.bfloat16
        if bf16 in (data.dtype, weight.dtype) or (data.dtype == half and weight.dtype == half):
            return result
        if data.shape[0] > 880801 or data.numel() >= 2**31 - 1:
            return result
        if grad_input.is_contiguous(memory_format=fmt):
            return result
        self.applied[name] += 1
        return (grad_input.contiguous(memory_format=fmt), *result[1:])


_BATCH_NORM_BACKWARD = "aten.native_batch_norm_backward"
_CUDNN_BATCH_NORM_BACKWARD = "aten.cudnn_batch_norm_backward"
