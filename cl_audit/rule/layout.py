"""Memory-layout classification of a tensor from its shape and strides."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum, unique

import torch

__all__ = [
    "MemoryLayout", "StrideClass", "Strides", "classify", "is_dense", "layout_of", "map_strides",
    "stride_class",
]  # fmt: skip


@unique
class MemoryLayout(str, Enum):
    """Order in which a tensor's dimensions lie in memory.

    Only rank-4 and rank-5 tensors can be ``CHANNELS_LAST`` or ``AMBIGUOUS``; other ranks are
    ``CONTIGUOUS`` (row-major order) or ``OTHER``.
    """

    CHANNELS_LAST = "channels_last"
    CONTIGUOUS = "contiguous"
    AMBIGUOUS = "ambiguous"
    OTHER = "other"


@unique
class StrideClass(str, Enum):
    """How a tensor that is not contiguous lies in memory: ``dense`` when its elements fill
    their span (a permutation of a contiguous tensor), else ``sparse`` (a slice, a broadcast);
    then which of its last two dims has stride 1: ``dense-second`` is a transposed matrix, as
    are the (N, C, L) tokens of a flattened channels_last map."""

    DENSE_LAST = "dense-last"
    DENSE_SECOND = "dense-second"
    DENSE_NEITHER = "dense-neither"
    SPARSE_LAST = "sparse-last"
    SPARSE_SECOND = "sparse-second"
    SPARSE_NEITHER = "sparse-neither"


_CHANNELS_LAST_ORDER = {4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}


def _strides_follow(order: Sequence[int], shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when strides do not increase along ``order``, ignoring size-1 and broadcast dims."""
    previous = None
    for dim in order:
        if shape[dim] == 1 or strides[dim] == 0:
            continue
        if previous is not None and strides[dim] > previous:
            return False
        previous = strides[dim]
    return True


def classify(shape: Sequence[int], strides: Sequence[int]) -> MemoryLayout:
    """Classify a layout by the order of its strides over the dims that are not size 1.

    Density is not required, so a channel slice of an NHWC tensor is still channels_last.
    Dims of size 1 (and stride-0 broadcast dims) carry no order: when both orders fit, as for
    N1HW and NC11 tensors, the layout is ``AMBIGUOUS``.
    """
    rank = len(shape)
    contiguous = _strides_follow(range(rank), shape, strides)
    cl_order = _CHANNELS_LAST_ORDER.get(rank)
    if cl_order is None:
        return MemoryLayout.CONTIGUOUS if contiguous else MemoryLayout.OTHER
    channels_last = _strides_follow(cl_order, shape, strides)
    if contiguous and channels_last:
        return MemoryLayout.AMBIGUOUS
    if channels_last:
        return MemoryLayout.CHANNELS_LAST
    return MemoryLayout.CONTIGUOUS if contiguous else MemoryLayout.OTHER


_cache: dict[tuple[torch.Size, tuple[int, ...]], MemoryLayout] = {}
_CACHE_LIMIT = 65536


def layout_of(tensor: torch.Tensor) -> MemoryLayout:
    """``classify`` for a tensor, memoised on (shape, strides): this runs on every checked op."""
    key = (tensor.shape, tensor.stride())
    layout = _cache.get(key)
    if layout is None:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        layout = _cache[key] = classify(key[0], key[1])
    return layout


def is_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when the elements fill their span without overlap (torch's "non-overlapping and
    dense"): each stride, from the smallest, is the product of the sizes of the dims laid out
    within it."""
    span = 1
    for stride, size in sorted((st, sz) for sz, st in zip(shape, strides, strict=True) if sz > 1):
        if stride != span:
            return False
        span *= size
    return True


def stride_class(tensor: torch.Tensor) -> StrideClass | None:
    """How ``tensor`` lies when it is not contiguous (``StrideClass``); None when it is."""
    if tensor.is_contiguous():
        return None
    shape, strides = tensor.shape, tensor.stride()
    dense = "dense" if is_dense(shape, strides) else "sparse"
    if shape[-1] == 1 or strides[-1] == 1:
        inner = "last"
    elif len(shape) > 1 and (shape[-2] == 1 or strides[-2] == 1):
        inner = "second"
    else:
        inner = "neither"
    return StrideClass(f"{dense}-{inner}")


Strides = tuple[tuple[int, ...], tuple[int, ...]]


def map_strides(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> Strides | None:
    """A copying operation's strides, in and out: its first 4-D or 5-D input's (else its first
    input's) and its first output's; None without either."""
    source = next((t for t in inputs if t.dim() in (4, 5)), inputs[0] if inputs else None)
    if source is None or not outputs:
        return None
    return tuple(source.stride()), tuple(outputs[0].stride())
