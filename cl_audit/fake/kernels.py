"""Fake tensors: layouts come from the operators' meta functions, no data is computed.

Parameters and buffers are wrapped as fake tensors on the target device and the forward runs
through ``torch.func.functional_call`` under a ``FakeTensorMode``, so memory stays small whatever
the model size (sweeps build timm models on the meta device) and ``--device cuda`` works without
a GPU: the verdict is then a prediction from the CUDA meta functions, corrected where the CUDA
kernels' source says they differ (``cl_audit.predict.divergences``).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cl_audit.compat.attention import fused_attention
from cl_audit.compat.fake_base import FakeTensorMode, Run
from cl_audit.compat.modes import FunctionLayer
from cl_audit.compat.operators import aten_op_name
from cl_audit.compat.storage import suggest_memory_format
from cl_audit.compat.versions import TORCH_VERSION
from cl_audit.fake.mode import dispatch_layer, fake_tensor
from cl_audit.predict.divergences import (
    ATTENTION_SOURCE,
    BATCH_NORM_BACKWARD_SOURCE,
    CPU_BATCH_NORM_GRADIENT,
    CUDA_BATCH_NORM_GRADIENT,
    CUDA_KERNEL_OVERRIDES,
    BatchNormGradient,
    KernelOverride,
)
from cl_audit.report import AppliedOverride
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = ["AttentionKernelMode", "KernelSourceMode", "fake_state"]


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


class KernelSourceMode:
    """Below the audit, the fake mode's first look at each operation (``over``): gives an
    overridden operation's output the layout its kernel's source says, so the audit and the
    rest of the model see what the real kernel would return: contiguous for a ``KernelOverride``
    whose first input is channels_last; a batch norm's input gradient as the device's kernels
    lay it out (``batch_norm``). With ``cudnn_batch_norm``, cuDNN's batch norm and its backward
    allocate their outputs as their kernels do (``_cudnn_outputs``) instead of running torch's
    fake decomposition (tens of fake operations each). ``applied`` counts the outputs laid out
    otherwise than the fake implementation would: for a batch norm's backward, each whose input
    gradient the kernels lay out otherwise than the decomposition (which follows the incoming
    gradient)."""

    def __init__(
        self,
        overrides: tuple[KernelOverride, ...],
        cudnn_batch_norm: bool = False,
        batch_norm: BatchNormGradient | None = None,
    ) -> None:
        self._overrides = {o.op: o for o in overrides}
        self._sources = {o.op: o.source for o in overrides}
        self._cudnn = cudnn_batch_norm
        self._batch_norm = batch_norm
        if batch_norm is not None:
            self._sources[_BATCH_NORM_BACKWARD] = batch_norm.source
        if cudnn_batch_norm:
            self._sources[_CUDNN_BATCH_NORM_BACKWARD] = BATCH_NORM_BACKWARD_SOURCE
        self.applied: Counter[str] = Counter()

    @classmethod
    def for_device(cls, device: torch.device) -> KernelSourceMode:
        """On a CUDA device the CUDA overrides that hold for this torch, cuDNN's batch norm and
        CUDA's batch norm gradient; on the CPU the CPU's batch norm gradient."""
        if device.type != "cuda":
            return cls((), batch_norm=CPU_BATCH_NORM_GRADIENT)
        holding = tuple(o for o in CUDA_KERNEL_OVERRIDES if o.holds(TORCH_VERSION))
        return cls(holding, cudnn_batch_norm=True, batch_norm=CUDA_BATCH_NORM_GRADIENT)

    def over(self, mode: FakeTensorMode) -> contextlib.AbstractContextManager[None]:
        """While entered, every operation ``mode`` (from ``new_fake_mode``) fakes passes here
        first, as under a dispatch mode pushed right above it."""
        return dispatch_layer(mode, self._dispatch)

    def applied_overrides(self) -> tuple[AppliedOverride, ...]:
        """The overrides that changed an operation's output, with how many times."""
        return tuple(
            AppliedOverride(op, self.applied[op], source)
            for op, source in self._sources.items()
            if self.applied[op]
        )

    def _dispatch(self, func: Any, args: Any, kwargs: dict[str, Any], run: Run) -> Any:
        name = aten_op_name(func)
        if self._cudnn and name in _CUDNN_OUTPUTS and not kwargs:
            outputs = _cudnn_outputs(name, args, run)
            if outputs is not None:
                if name == _CUDNN_BATCH_NORM_BACKWARD and _converts_gradient(args):
                    self.applied[name] += 1
                return outputs
        result = run(func, args, kwargs)
        if name == _BATCH_NORM_BACKWARD and self._batch_norm is not None:
            return self._native_batch_norm_gradient(self._batch_norm, args, result, run)
        override = self._overrides.get(name)
        if override is None or not args or not isinstance(args[0], torch.Tensor):
            return result
        if layout_of(args[0]) is not MemoryLayout.CHANNELS_LAST:
            return result
        self.applied[override.op] += 1
        if isinstance(result, torch.Tensor):
            return _contiguous(result, torch.contiguous_format, run)
        outputs = list(result)
        changed = outputs[override.output]
        outputs[override.output] = _contiguous(changed, torch.contiguous_format, run)
        return type(result)(outputs)

    def _native_batch_norm_gradient(
        self, kernels: BatchNormGradient, args: Any, result: Any, run: Run
    ) -> Any:
        """The input gradient of a batch norm's backward, laid out as the device's kernels lay
        it out: as the input in training (on CUDA cuDNN's and the native kernel's alike,
        whatever the dtype or affine weight), and outside training as the input on the CPU,
        contiguous on CUDA. Torch's fake decomposition follows the incoming gradient instead.
        An input in either layout (NC11) is left as it is."""
        data, train = args[1], len(args) > 7 and bool(args[7])
        grad_input = result[0]
        if grad_input is None or data.dim() not in (4, 5):
            return result
        as_input = train or not kernels.eval_contiguous
        fmt = suggest_memory_format(data) if as_input else torch.contiguous_format
        if data.is_contiguous() and data.is_contiguous(memory_format=_CHANNELS_LAST[data.dim()]):
            return result
        if grad_input.is_contiguous(memory_format=fmt):
            return result
        self.applied[_BATCH_NORM_BACKWARD] += 1
        return (_contiguous(grad_input, fmt, run), *result[1:])


def _contiguous(tensor: torch.Tensor, fmt: torch.memory_format, run: Run) -> torch.Tensor:
    """``tensor.contiguous(memory_format=fmt)``, faked by ``run`` (``Tensor.contiguous``: the
    tensor itself where it already is, else a clone in ``fmt``)."""
    if tensor.is_contiguous(memory_format=fmt):
        return tensor
    return run(_CLONE, (tensor,), {"memory_format": fmt})


def _cudnn_outputs(name: str, args: Any, run: Run) -> tuple[torch.Tensor, ...] | None:
    """The outputs cuDNN's batch norm (forward or backward) allocates, as
    aten/src/ATen/native/cudnn/BatchNorm.cpp does: the output or input gradient
    ``empty(input.sizes(), input's dtype, input.suggest_memory_format())``, the saved statistics
    and the weight's gradients the weight's size (statistics: size 0 outside training) and
    dtype, the reserve space size 0 (its size is cuDNN's, as torch's decomposition leaves it);
    None where the input is not contiguous in its own format (the kernel refuses it)."""
    data, weight = args[0], args[1 if name == _CUDNN_BATCH_NORM else 2]
    fmt = suggest_memory_format(data)
    if not data.is_contiguous(memory_format=fmt):
        return None

    def empty(shape: Any, like: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        options = {"dtype": like.dtype, "device": like.device, **kwargs}
        return run(_EMPTY, (list(shape),), options)

    output = empty(data.shape, data, memory_format=fmt)
    if name == _CUDNN_BATCH_NORM_BACKWARD:
        return (output, *(empty(weight.shape, weight) for _ in "wb"))
    statistics = (data.shape[1],) if args[5] else (0,)
    saved = (empty(statistics, weight) for _ in range(2))
    return (output, *saved, empty((0,), data, dtype=torch.uint8))


def _converts_gradient(args: Any) -> bool:
    """Whether cuDNN's batch norm backward converts its incoming gradient (``args[1]``) to
    the input's layout (``grad_output.contiguous(input.suggest_memory_format())``)."""
    return not args[1].is_contiguous(memory_format=suggest_memory_format(args[0]))


_BATCH_NORM_BACKWARD = "aten.native_batch_norm_backward"
_CLONE = torch.ops.aten.clone.default
_EMPTY = torch.ops.aten.empty.memory_format
_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
_CUDNN_BATCH_NORM = "aten.cudnn_batch_norm"
_CUDNN_BATCH_NORM_BACKWARD = "aten.cudnn_batch_norm_backward"
_CUDNN_OUTPUTS = (_CUDNN_BATCH_NORM, _CUDNN_BATCH_NORM_BACKWARD)


_ATTENTION = F.scaled_dot_product_attention
_CUDNN_ATTENTION = "aten._scaled_dot_product_cudnn_attention"
_EFFICIENT_ATTENTION = "aten._scaled_dot_product_efficient_attention"


class AttentionKernelMode(FunctionLayer):
    """Below the audit's own modes, on fake CUDA: ``F.scaled_dot_product_attention`` runs the
    fused kernel a Hopper GPU picks (``ATTENTION_SOURCE``), through its operator, so that its
    output, its backward and their layouts are the kernel's; elsewhere the call goes on to the
    math path, as fake tensors take it. ``applied`` counts the calls given a fused kernel. The
    audit's function mode does its work as a part of its own (``FunctionLayer``)."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: Counter[str] = Counter()

    def applied_overrides(self) -> tuple[AppliedOverride, ...]:
        return tuple(
            AppliedOverride(op, count, ATTENTION_SOURCE) for op, count in self.applied.items()
        )

    def handle(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        # every torch call of a fake CUDA run passes here: anything but attention goes on at once
        if func is not _ATTENTION:
            return func(*args, **kwargs)
        output = self._fused(*args, **kwargs)
        return output if output is not None else func(*args, **kwargs)

    def _fused(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor | None:
        """The fused kernel's output, or None where the math path runs."""
        tensors = (query, key, value)
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
            return None
        if dropout_p or enable_gqa or query.device.type != "cuda":
            return None
        if not query.size(1) == key.size(1) == value.size(1):
            return None  # grouped-query attention: not measured
        if not query.size(-1) == key.size(-1) == value.size(-1) or query.size(-1) % 8:
            return None
        if query.size(-1) > 256 or any(t.stride(-1) != 1 for t in tensors):
            return None
        dtype = query.dtype
        if torch.is_autocast_enabled("cuda") and dtype.is_floating_point:
            dtype = torch.get_autocast_dtype("cuda")  # the composite is on autocast's list
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return None
        learned = attn_mask is not None and attn_mask.requires_grad
        efficient = dtype == torch.float32 or learned
        query, key, value = (t.to(dtype) for t in tensors)
        bias = None if attn_mask is None else _attention_bias(attn_mask, query, key, efficient)
        log_sumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        output = fused_attention(efficient, query, key, value, bias, log_sumexp, is_causal, scale)
        if output is not None:
            self.applied[_EFFICIENT_ATTENTION if efficient else _CUDNN_ATTENTION] += 1
        return output


def _attention_bias(
    mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor, efficient: bool
) -> torch.Tensor:
    """The mask as the composite hands it to the kernel: a boolean one made additive in the
    query's dtype; for the memory-efficient kernel expanded to (B, H, L, S) and, where S is not
    a multiple of 16, padded to one and sliced back (aten/src/ATen/native/transformers)."""
    if mask.dtype == torch.bool:
        zero = torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device)
        mask = torch.where(mask, zero, float("-inf"))
    else:
        mask = mask.to(query.dtype)
    if not efficient:
        return mask
    length = key.size(2)
    mask = mask.expand(query.size(0), query.size(1), query.size(2), length)
    if length % 16:
        mask = F.pad(mask, (0, 16 - length % 16))[..., :length]
    return mask
