"""Dispatcher operators: whether a callable is one, its name, its schema, and its traits (the cost
ledger asks once per distinct operator; the fake engine reads schemas' aliasing)."""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = [
    "aten_op_name",
    "composite_implicit",
    "is_operator",
    "is_overload",
    "op_traits",
    "returns_list",
    "schema_of",
]


_POINTWISE = getattr(torch.Tag, "pointwise", None)


_REDUCTION = getattr(torch.Tag, "reduction", None)


def is_operator(func: object) -> bool:
    """A dispatcher operator called from Python (``torch.ops.torchvision.roi_align``)."""
    return isinstance(func, (torch._ops.OpOverloadPacket, torch._ops.OpOverload))


def is_overload(func: object) -> bool:
    """One overload of a dispatcher operator (``aten.add.Tensor``), as dispatch modes see it."""
    return isinstance(func, torch._ops.OpOverload)


def schema_of(func: Any) -> Any:
    """An operator overload's schema (its arguments, returns and their aliasing), or None for
    anything else."""
    return getattr(func, "_schema", None)


def returns_list(func: Any) -> bool:
    """Whether an operator overload returns one list of tensors."""
    returns = func._schema.returns
    return len(returns) == 1 and isinstance(returns[0].type, torch.ListType)


def composite_implicit(func: Any) -> bool:
    """Whether an overload has a composite kernel (``CompositeImplicitAutograd``): its
    decomposition, not a kernel of its own, decides what it returns and aliases."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), torch._C.DispatchKey.CompositeImplicitAutograd
    )


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
