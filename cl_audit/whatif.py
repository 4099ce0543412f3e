"""What-if changes: one operation at one model-code line done another way while the model runs,
so that a remedy is proven on the model, not assumed (``cl_audit.phases.verify``).

A change stands for an edit of the source line: it is made at every call from that line, in
whichever layout the model runs, and only where the call is the pattern it is written for (a
``.contiguous()`` writing NCHW order); anywhere else the operation runs as written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from cl_audit.attribution import call_site
from cl_audit.intercept.naming import python_op_name

__all__ = ["CHANGES", "Change", "WhatIf"]

Call = Callable[[tuple[Any, ...], Mapping[str, Any]], "torch.Tensor | None"]


@dataclass(frozen=True)
class Change:
    """An edit of the calls to ``op`` at one line: ``make`` returns the edited call's result, or
    None where the call is not the pattern (it then runs as written)."""

    name: str
    op: str  # the Python-level operation, as ``python_op_name`` names it
    advice: str  # the edit, as the user would write it
    make: Call


def _nchw_order(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The tensor of a ``.contiguous()`` that writes NCHW order (no ``memory_format``, or
    ``torch.contiguous_format``)."""
    fmt = kwargs.get("memory_format", args[1] if len(args) > 1 else torch.contiguous_format)
    tensor = args[0] if args else None
    return tensor if isinstance(tensor, torch.Tensor) and fmt is torch.contiguous_format else None


def _drop(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    return _nchw_order(args, kwargs)


def _channels_last(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    x = _nchw_order(args, kwargs)
    if x is None or x.dim() not in (4, 5):
        return None
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return x.contiguous(memory_format=fmt)


def _channel_shuffle(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """A channel shuffle's copy, ``x.view(b, groups, per_group, h, w).transpose(1, 2)
    .contiguous()``, written by ``F.channel_shuffle(x, groups)`` and viewed in the 5-D shape
    the next line reads back as ``(b, c, h, w)``: the 5-D tensor's channel dimensions are one
    channel dimension of a 4-D tensor, split and transposed, when dimension 2 steps over
    dimension 1's whole extent."""
    x = _nchw_order(args, kwargs)
    if x is None or x.dim() != 5:
        return None
    b, per_group, groups, h, w = x.shape
    if per_group < 2 or groups < 2 or x.stride(2) != per_group * x.stride(1):
        return None
    strides = (x.stride(0), x.stride(1), x.stride(3), x.stride(4))
    maps = x.as_strided((b, per_group * groups, h, w), strides, x.storage_offset())
    return F.channel_shuffle(maps, groups).view(x.shape)


CHANGES: dict[str, Change] = {
    change.name: change
    for change in (
        Change("drop", "Tensor.contiguous", "drop the .contiguous()", _drop),
        Change(
            "channels_last",
            "Tensor.contiguous",
            "write .contiguous(memory_format=torch.channels_last) (channels_last_3d for 5-D)",
            _channels_last,
        ),
        Change(
            "channel_shuffle",
            "Tensor.contiguous",
            "replace the view, transpose, .contiguous() and view with "
            "F.channel_shuffle(x, groups) (nn.ChannelShuffle)",
            _channel_shuffle,
        ),
    )
}


class WhatIf(TorchFunctionMode):
    """Makes ``change`` at the calls from ``line`` (a call site as reports name it) while it is
    on the mode stack; ``applied`` counts the calls it changed."""

    def __init__(self, change: Change, line: str) -> None:
        super().__init__()
        self.change, self.line = change, line
        self.applied = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if python_op_name(func) == self.change.op and call_site(sys._getframe(1)) == self.line:
            result = self.change.make(args, kwargs)
            if result is not None:
                self.applied += 1
                return result
        return func(*args, **kwargs)
