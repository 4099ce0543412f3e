"""What-if changes: one operation at one model-code line done another way while the model runs,
so that a remedy is proven on the model, not assumed (``cl_audit.phases.verify``).

A change stands for an edit of the source line: it is made at every call from that line, in
whichever layout the model runs, and only where the call is the pattern it is written for (a
``.contiguous()`` writing NCHW order); anywhere else the operation runs as written.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from cl_audit.compare.operands import FACTORIES, named, operands_channels_last
from cl_audit.intercept.naming import python_op_name
from cl_audit.rule.attribution import call_site
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = ["CHANGES", "Change", "WhatIf"]

Call = Callable[[tuple[Any, ...], Mapping[str, Any]], "torch.Tensor | None"]
# (operation name, the operation, args, kwargs) -> the edited result, or None (run as written)
Follow = Callable[[str, Any, tuple[Any, ...], Mapping[str, Any]], "torch.Tensor | None"]
Named = Callable[[tuple[Any, ...], Mapping[str, Any], Mapping[int, tuple[str, "str | None"]]], Any]


@dataclass(frozen=True)
class Change:
    """An edit of the calls to ``op`` at one line: ``make`` returns the edited call's result, or
    None where the call is not the pattern (it then runs as written). An edit of several
    calls has ``follow``: it sees each later call that reads a result of the edit, from any
    line, and returns what the edited code returns there (its own results followed in turn),
    or None to run the call as written."""

    name: str
    ops: frozenset[str]  # the Python-level operations, as ``python_op_name`` names them
    advice: str  # the edit, as the user would write it
    make: Call
    follow: Follow | None = None
    # which operand the edit is for, told from the factories' results seen (``compare.operands``)
    named: Named | None = None


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


def _target_shape(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The shape a ``reshape`` or ``view`` call asks for, given as sizes or as one sequence."""
    shape = (
        args[1:]
        if len(args) > 2 or (len(args) == 2 and isinstance(args[1], int))
        else (args[1] if len(args) > 1 else kwargs.get("shape"))
    )
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(
        isinstance(size, int) for size in shape
    ):
        return None
    return tuple(shape)


def _rows_in_memory_order(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """A channels_last 4-D tensor reshaped to one row per output channel, ``w.reshape(1, out,
    -1)`` (or ``(out, -1)``), taken in memory order instead, ``w.permute(0, 2, 3, 1)
    .reshape(...)``: a view, its rows holding the same elements in (kh, kw, in) order."""
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.is_contiguous():
        return None
    if not x.is_contiguous(memory_format=torch.channels_last):
        return None
    shape = _target_shape(args, kwargs)
    if shape is None:
        return None
    rows = x.permute(0, 2, 3, 1).reshape(shape)
    leading = [size for size in rows.shape if size != 1]
    if rows.dim() not in (2, 3) or not leading or leading[0] != x.shape[0]:
        return None
    return rows


_ROW_STATISTICS = ("torch.batch_norm", "F.batch_norm")  # per-row statistics: order-free
_BACK = ("Tensor.reshape_as", "Tensor.reshape", "Tensor.view_as", "Tensor.view")


def _rows_back(name: str, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """After ``_rows_in_memory_order``: a batch norm of the rows (statistics per output channel,
    whatever the order within a row) keeps their order; reshaping them back to the weight's
    (out, in, kh, kw) shape reads them in that order, ``.reshape(out, kh, kw, in).permute(0,
    3, 1, 2)``: the same values, channels_last."""
    rows = args[0]
    if name in _ROW_STATISTICS:
        return func(*args, **kwargs)
    if name not in _BACK or len(args) < 2:
        return None
    target = args[1]
    shape = tuple(target.shape) if isinstance(target, torch.Tensor) else tuple(args[1:])
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    if len(shape) != 4 or rows.numel() != math.prod(shape):
        return None
    out, channels, height, width = shape
    return rows.reshape(out, height, width, channels).permute(0, 3, 1, 2)


def _allocate_channels_last(
    args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> torch.Tensor | None:
    """A new 4-D or 5-D floating-point tensor, ``x.new_full(shape, value)`` (NCHW order),
    allocated channels_last instead: ``torch.empty(shape, memory_format=...).fill_(value)``,
    the same values in the other order (data copied into it afterwards keeps that order)."""
    if len(args) < 3 or not isinstance(args[0], torch.Tensor):
        return None
    source, size, value = args[0], args[1], args[2]
    if not isinstance(size, (tuple, list, torch.Size)) or len(size) not in (4, 5):
        return None
    if "memory_format" in kwargs or kwargs.keys() - {"dtype", "device"}:
        return None
    dtype = kwargs.get("dtype") or source.dtype
    if not dtype.is_floating_point:
        return None
    fmt = torch.channels_last if len(size) == 4 else torch.channels_last_3d
    device = kwargs.get("device") or source.device
    return torch.empty(tuple(size), dtype=dtype, device=device, memory_format=fmt).fill_(value)


def _channels_last_map(x: Any, volumes: bool = False) -> bool:
    """A 4-D tensor (or, with ``volumes``, a 5-D one too) that the rule calls channels_last
    (``rule.layout``: not also NCHW-ordered)."""
    ranks = (4, 5) if volumes else (4,)
    return (
        isinstance(x, torch.Tensor)
        and x.dim() in ranks
        and layout_of(x) is MemoryLayout.CHANNELS_LAST
    )


_INSTANCE_NORM = inspect.signature(F.instance_norm)


def _group_norm(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """An instance norm of a channels_last map (or channels_last_3d volume) with no running
    statistics, computed as a group norm with one group per channel: the same mean and
    variance per sample and channel, and the same affine weight and bias per channel."""
    try:
        call = _INSTANCE_NORM.bind(*args, **kwargs)
    except TypeError:
        return None
    call.apply_defaults()
    given = call.arguments
    x = given["input"]
    if not _channels_last_map(x, volumes=True) or not given["use_input_stats"]:
        return None  # normalised by running statistics, which a group norm has not
    if given["running_mean"] is not None or given["running_var"] is not None:
        return None  # a training forward updates them: a group norm would not
    return F.group_norm(x, x.shape[1], given["weight"], given["bias"], given["eps"])


def _over_last_dim(function: Callable[..., torch.Tensor]) -> Call:
    """A softmax (or log-softmax) over the channels of a channels_last map, taken over the last
    dimension of its channels-last view instead, ``x.permute(0, 2, 3, 1).softmax(-1)
    .permute(0, 3, 1, 2)``: the same values, each channel vector contiguous in memory, no copy
    in or out."""

    def make(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        rest = {k: v for k, v in kwargs.items() if k not in ("input", "dim", "_stacklevel")}
        if not _channels_last_map(x) or dim not in (1, -3) or len(args) > 2:
            return None
        if rest.keys() - {"dtype"}:
            return None
        return function(x.permute(0, 2, 3, 1), -1, **rest).permute(0, 3, 1, 2)

    return make


def _planes(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """A channels_last map ``x`` of shape (b, c, h, w) reshaped to one plane per sample and
    channel, ``x.reshape(b * c, 1, h, w)`` (to filter each channel with one kernel): left as it
    is instead, standing for the planes (the same elements in the same logical order, in the
    shape (b, c * 1, h, w)); ``_planes_followed`` carries the calls that read it."""
    x = args[0] if args else None
    shape = _target_shape(args, kwargs)
    if not _channels_last_map(x) or shape is None or len(shape) != 4:
        return None
    b, c, h, w = x.shape
    if c < 2 or shape[1:] != (1, h, w) or shape[0] not in (b * c, -1):
        return None
    return x.view(x.shape)  # an alias: no copy


def _planes_followed(
    name: str, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> torch.Tensor | None:
    """After ``_planes``: a tensor of shape (b, c * m, h, w) stands for planes of shape (b * c,
    m, h, w), its elements in their logical order. A spatial pad pads it alike; a convolution
    of the planes with a kernel of ``m`` input channels is the grouped (depthwise for ``m`` 1)
    convolution of the map with the kernel repeated per channel, ``groups=c``, standing for
    (b * c, k, h', w'); a reshape or view reads the elements in the order the planes had."""
    stand_in = args[0]
    if name == "F.pad":
        pad = args[1] if len(args) > 1 else kwargs.get("pad")
        return func(*args, **kwargs) if pad is not None and len(pad) <= 4 else None
    if name in ("torch.conv2d", "F.conv2d"):
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        weight, groups = given.get("weight"), given.get("groups", 1)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 4 or groups != 1:
            return None
        channels, remainder = divmod(stand_in.shape[1], weight.shape[1])
        if remainder or channels < 2:
            return None
        bias = given.get("bias")
        return F.conv2d(
            stand_in,
            weight.repeat(channels, 1, 1, 1),
            None if bias is None else bias.repeat(channels),
            given.get("stride", 1),
            given.get("padding", 0),
            given.get("dilation", 1),
            channels,
        )
    if name in ("Tensor.reshape", "torch.reshape", "Tensor.view"):
        shape = _target_shape(args, kwargs)
        return None if shape is None else stand_in.reshape(shape)
    return None


_CONTIGUOUS = frozenset({"Tensor.contiguous"})

CHANGES: dict[str, Change] = {
    change.name: change
    for change in (
        Change("drop", _CONTIGUOUS, "drop the .contiguous()", _drop),
        Change(
            "channels_last",
            _CONTIGUOUS,
            "write .contiguous(memory_format=torch.channels_last) (channels_last_3d for 5-D)",
            _channels_last,
        ),
        Change(
            "channel_shuffle",
            _CONTIGUOUS,
            "replace the view, transpose, .contiguous() and view with "
            "F.channel_shuffle(x, groups) (nn.ChannelShuffle)",
            _channel_shuffle,
        ),
        Change(
            "allocate_channels_last",
            frozenset({"Tensor.new_full"}),
            "allocate it channels_last: torch.empty(shape, dtype=x.dtype, device=x.device, "
            "memory_format=torch.channels_last).fill_(value) (channels_last_3d for 5-D)",
            _allocate_channels_last,
        ),
        Change(
            "rows_in_memory_order",
            frozenset({"Tensor.reshape"}),
            "standardise in NHWC order: rows = w.permute(0, 2, 3, 1).reshape(1, out, -1), "
            "normalise them, then .reshape(out, kh, kw, in).permute(0, 3, 1, 2) (the "
            "per-output-channel statistics do not depend on the order within a row)",
            _rows_in_memory_order,
            _rows_back,
        ),
        Change(
            "depthwise",
            frozenset({"Tensor.reshape", "torch.reshape", "Tensor.view"}),
            "filter the map with a grouped convolution instead of merging batch and channels: "
            "F.conv2d(x, kernel.repeat(c, 1, 1, 1), groups=c) on the (b, c, h, w) map, then "
            ".view(b, c, k, h, w) (the same values; no copy)",
            _planes,
            _planes_followed,
        ),
        Change(
            "group_norm",
            frozenset({"F.instance_norm", "torch.instance_norm"}),
            "normalise with nn.GroupNorm(C, C) (F.group_norm(x, C, weight, bias, eps)): one "
            "group per channel is an instance norm, computed in the input's layout",
            _group_norm,
        ),
        Change(
            "operands_channels_last",
            frozenset({"torch.cat", "torch.concat", "torch.concatenate"}),
            "make the NCHW operand in its partners' layout where it is created: "
            "torch.ones_like(x[:, :1]) for a mask of x's, or torch.empty(size, dtype=..., "
            "device=..., memory_format=torch.channels_last).fill_(value)",
            operands_channels_last,
            named=named,
        ),
        Change(
            "softmax_last_dim",
            frozenset({"Tensor.softmax", "torch.softmax", "F.softmax"}),
            "take it over the last dimension of the channels-last view: "
            "x.permute(0, 2, 3, 1).softmax(-1).permute(0, 3, 1, 2)",
            _over_last_dim(torch.softmax),
        ),
        Change(
            "log_softmax_last_dim",
            frozenset({"Tensor.log_softmax", "torch.log_softmax", "F.log_softmax"}),
            "take it over the last dimension of the channels-last view: "
            "x.permute(0, 2, 3, 1).log_softmax(-1).permute(0, 3, 1, 2)",
            _over_last_dim(torch.log_softmax),
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
        self.named: str | None = None  # the operand the edit was for, and where it was made
        self._made: dict[int, torch.Tensor] = {}  # the edit's results, followed (by identity)
        self._makers: dict[int, tuple[str, str | None]] = {}  # factory results (by identity)
        self._held: list[torch.Tensor] = []  # keeps those identities theirs

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = python_op_name(func)
        follow = self.change.follow
        if follow is not None and args and self._made.get(id(args[0])) is args[0]:
            result = follow(name, func, args, kwargs)
            if result is not None:
                self._made[id(result)] = result
                return result
        describe = self.change.named
        if describe is not None and name in FACTORIES:
            made = func(*args, **kwargs)
            self._makers[id(made)] = (name, call_site(sys._getframe(1)))
            self._held.append(made)
            return made
        if name in self.change.ops and call_site(sys._getframe(1)) == self.line:
            result = self.change.make(args, kwargs)
            if result is not None:
                if describe is not None and self.named is None:  # the call's own arguments
                    self.named = describe(args, kwargs, self._makers)
                self.applied += 1
                if follow is not None:
                    self._made[id(result)] = result
                return result
        return func(*args, **kwargs)
