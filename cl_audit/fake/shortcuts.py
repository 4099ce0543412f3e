"""Which operations cl-audit's fake mode answers itself, and how it tells: activations' backward
kernels as the binary operation they are, casts that keep the strides, backward operations by
their meta kernels, list-writing operations (optimizers, the scaler) that change no metadata,
and operations on real tensors alone."""

from __future__ import annotations

import functools
from typing import Any

import torch

from cl_audit.compat.fake_base import FakeTensor, is_fake
from cl_audit.compat.operators import schema_of
from cl_audit.compat.pytree import tensor_leaves
from cl_audit.rule.layout import is_dense

__all__ = [
    "EMPTY_STRIDED",
    "LAYER_NORM_BACKWARD",
    "MUL",
    "ON_META",
    "TO_COPY",
    "UNSAFE_VIEW",
    "binary_operands",
    "dense_cast",
    "plain_fake",
    "real_only",
    "valid_as_laid_out",
    "writes_lists",
]


_aten = torch.ops.aten


MUL = _aten.mul.Tensor


# Activations' backward kernels are binary TensorIterator operations on two of their arguments,
# in this order (their meta functions in aten/src/ATen/native/Activation.cpp, or their CUDA
# kernels: ``build_borrowing_binary_op(grad_input, a, b)``); torch fakes them by Python
# decompositions of tens of fake operations, where a multiplication of the same two tensors
# gives the same output.
_BINARY_BACKWARDS = {
    _aten.silu_backward.default: (0, 1),
    _aten.sigmoid_backward.default: (0, 1),
    _aten.tanh_backward.default: (0, 1),
    _aten.gelu_backward.default: (0, 1),
    _aten.threshold_backward.default: (1, 0),
    _aten.hardtanh_backward.default: (0, 1),
    _aten.hardswish_backward.default: (0, 1),
    _aten.hardsigmoid_backward.default: (0, 1),
    _aten.leaky_relu_backward.default: (1, 0),
    _aten.elu_backward.default: (0, 5),
    _aten.mish_backward.default: (0, 1),
    _aten.softplus_backward.default: (0, 1),
}


TO_COPY = _aten._to_copy.default


UNSAFE_VIEW = _aten._unsafe_view.default


LAYER_NORM_BACKWARD = _aten.native_layer_norm_backward.default


# cross-entropy's operations, which a training audit's own loss runs on every classifier, and
# backward operations a training step sends many of, which torch fakes by their meta kernels
# too (no fake implementation of their own, unlike convolution's, whose fake layout follows the
# device's backend): group norm's (4-13 ms a call by torch's fake path, 2 ms on meta tensors),
# the fused attention kernels' and batch norm's (0.7 against 0.1 ms, measured on 145 calls of
# nine timm models, the outputs alike in each)
ON_META = frozenset(
    {
        _aten._log_softmax.default,
        _aten._log_softmax_backward_data.default,
        _aten.nll_loss_forward.default,
        _aten.nll_loss_backward.default,
        _aten.native_group_norm_backward.default,
        _aten._scaled_dot_product_cudnn_attention_backward.default,
        _aten._scaled_dot_product_efficient_attention_backward.default,
        _aten.native_batch_norm_backward.default,
    }
)


EMPTY_STRIDED = _aten.empty_strided.default


_CAST_KEYWORDS = {"dtype", "memory_format", "layout", "device", "pin_memory", "non_blocking"}


def plain_fake(value: Any) -> bool:
    """Whether ``value`` is a fake tensor whose metadata alone decides what a meta kernel
    makes of it: strided, real-valued, no value tracked (a fake constant)."""
    return (
        type(value) is FakeTensor
        and value.constant is None
        and value.layout is torch.strided
        and not value.dtype.is_complex
    )


def dense_cast(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a ``_to_copy`` only changes the dtype (or nothing) of a tensor with dense,
    non-overlapping strides: its kernel (TensorConversions.cpp, ``memory_format`` preserve)
    then allocates ``empty_strided`` with the same strides, which torch fakes by a Python
    decomposition."""
    if len(args) != 1 or not is_fake(args[0]) or not kwargs.keys() <= _CAST_KEYWORDS:
        return False
    data = args[0]
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return False
    if kwargs.get("device") not in (None, data.device) or kwargs.get("non_blocking"):
        return False
    return data.layout == torch.strided and is_dense(data.shape, data.stride())


def binary_operands(func: Any, args: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The two tensors an activation's backward kernel iterates over, in its order, where they
    have one shape and dtype (no broadcast, no promotion); else None."""
    order = _BINARY_BACKWARDS.get(func)
    if order is None:
        return None
    a, b = args[order[0]], args[order[1]]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    return a, b


@functools.cache
def writes_lists(func: Any) -> bool:
    """An operation that returns nothing and writes the list of tensors it is first given:
    the optimizers' ``_foreach_*_``, AMP's unscale, the fused optimizers."""
    schema = schema_of(func)
    if schema is None or schema.returns or not schema.arguments:
        return False
    first = schema.arguments[0]
    info = first.alias_info
    return str(first.type) == "List[Tensor]" and info is not None and info.is_write


_NUMBERS = (int, float, bool)


def valid_as_laid_out(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a ``writes_lists`` operation is valid on any device's kernel, seen from its
    arguments alone: its tensor lists as long as the first, and index by index fake tensors of
    one shape, dtype and device, floating point, without a constant; its other lists numbers,
    as many; each other tensor one floating-point element on the first list's device; the rest
    numbers or None. Such an operation changes no tensor's metadata and returns nothing, so
    its fake kernel (per tensor: a broadcast check in Python, 8 ms an SGD step of ResNet-50's
    161 parameters) has nothing to tell; anything else goes to torch's, as does every call
    with a shape environment (comparing symbolic shapes would add guards)."""
    first = args[0]
    if not first:
        return False
    lists, lone = [], []
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            if len(value) != len(first):
                return False
            if isinstance(value[0], torch.Tensor):
                lists.append(value)
            elif not all(type(v) in _NUMBERS for v in value):
                return False
        elif isinstance(value, torch.Tensor):
            lone.append(value)
        elif value is not None and type(value) not in _NUMBERS:
            return False
    for group in zip(*lists, strict=True):
        head = group[0]
        for tensor in group:
            if type(tensor) is not FakeTensor or tensor.constant is not None:
                return False
            if tensor.shape != head.shape or tensor.dtype != head.dtype:
                return False
            if tensor.fake_device != head.fake_device or not tensor.dtype.is_floating_point:
                return False
    device = first[0].fake_device
    return all(
        type(t) is FakeTensor
        and t.constant is None
        and t.numel() == 1
        and t.dtype.is_floating_point
        and t.fake_device == device
        for t in lone
    )


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


def real_only(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` runs for real: every tensor real, on the CPU, none written or moved.
    Runs on every fake operation: the usual answer (a fake first argument) comes first."""
    if args and (type(args[0]) is FakeTensor or is_fake(args[0])):
        return False  # the exact type first: torch's ``is_fake`` checks subclasses at length
    if func in _LIFTS or schema_of(func).is_mutable or "device" in kwargs:
        return False
    tensors = tensor_leaves((args, kwargs))
    return bool(tensors) and all(
        not is_fake(t) and t.device.type == "cpu" and not t.is_meta for t in tensors
    )
