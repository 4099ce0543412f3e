"""Memory-layout classification of a tensor from its shape and strides."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum, unique

import torch

__all__ = ["MemoryLayout", "classify", "layout_of"]


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
