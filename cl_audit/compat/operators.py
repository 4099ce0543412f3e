"""Dispatcher operators: whether a callable is one, its name, and its traits (the cost ledger asks
once per distinct operator)."""

from __future__ import annotations

import functools

import torch

__all__ = ["aten_op_name", "is_operator", "op_traits"]


_POINTWISE = getattr(torch.Tag, "pointwise", None)


_REDUCTION = getattr(torch.Tag, "reduction", None)


def is_operator(func: object) -> bool:
    """A dispatcher operator called from Python (``torch.ops.torchvision.roi_align``)."""
    return isinstance(func, (torch._ops.OpOverloadPacket, torch._ops.OpOverload))


@functools.cache
def aten_op_name(op: object) -> str:
    """``aten.clone`` for the OpOverload ``aten.clone.default`` (once per operator: a packet's
    name is built anew at each ``str``, and every fake operation asks it)."""
    packet = getattr(op, "overloadpacket", None)
    return str(packet if packet is not None else op)


def op_traits(op: object) -> tuple[bool, bool, bool, bool]:
    """``(pointwise, reduction, view, in_place)`` of an aten operator overload, from its tags,
    ``is_view`` and the trailing underscore of in-place names; all False for anything else."""
    tags = getattr(op, "tags", ())
    packet = getattr(op, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    return (
        _POINTWISE is not None and _POINTWISE in tags,
        _REDUCTION is not None and _REDUCTION in tags,
        bool(getattr(op, "is_view", False)),
        name.endswith("_") and not name.endswith("__"),
    )
