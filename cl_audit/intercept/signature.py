"""A call's signature: what decides the copies a kernel makes inside it. Two calls of one
operator on tensors of the same dtype, device, shape and strides (and the same sharing of
storage among them), with the same other arguments, take the same path through the kernel:
the copies the profiler measured at the first stand for the second's. That is why a measured
run labels (and records) only the first call of each signature (``CallLabels.FIRST``): an
op-heavy model repeats a few signatures thousands of times. Checked by a comparison of runs:
the ledgers of a run labelling every call and of one labelling each signature's first call
are equal (tests/test_signature.py)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import torch

__all__ = ["call_signature"]

_DYNAMIC: dict[Any, bool] = {}  # operator -> whether its output's shape depends on data


class _Unkeyed(Exception):
    """A value that no signature describes."""


def call_signature(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable | None:
    """The call's operator, grad mode and arguments (tensors by dtype, device, shape, strides,
    conjugate and negative bits and the first argument sharing their storage; other values as
    they are). None where calls alike may copy differently: an operator whose output's shape
    depends on data (``torch.Tag.dynamic_output_shape``: ``nonzero``, ``masked_select``), a
    tensor that is not strided, a value that does not hash."""
    dynamic = _DYNAMIC.get(func)
    if dynamic is None:
        dynamic = _DYNAMIC[func] = torch.Tag.dynamic_output_shape in func.tags
    if dynamic:
        return None
    storages: list[int] = []
    try:
        described = (
            _described(args, storages),
            tuple(kwargs),
            _described(kwargs.values(), storages),
        )
        key = (func, torch.is_grad_enabled(), described)
        hash(key)
    except (_Unkeyed, TypeError):
        return None
    return key


def _described(values: Iterable[object], storages: list[int]) -> tuple[Hashable, ...]:
    described: list[Hashable] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.layout is not torch.strided:
                raise _Unkeyed
            storage = value.untyped_storage().data_ptr()
            shared = storages.index(storage) if storage in storages else -1
            storages.append(storage)
            described.append(
                (value.dtype, value.device, value.shape, value.stride(), value.is_conj(),
                 value.is_neg(), shared)
            )  # fmt: skip
        elif isinstance(value, (tuple, list)):
            described.append(_described(value, storages))
        else:
            described.append(value)  # type: ignore[arg-type]
    return tuple(described)
