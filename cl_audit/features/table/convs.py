"""Convolutions measured for ``cl-audit table``: the exact configurations a model runs, and a
general grid (dense 1x1 and 3x3, depthwise 3/5/7, grouped 3x3 by channels per group, stems from
3 channels, at the sides and channel counts models use), forward, input gradient and weight
gradient, each in channels_last and NCHW, alternated configuration by configuration. The grid
is walked in a fixed shuffled order (seed 58), so that a budget cut short leaves an even
sample of it."""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from cl_audit.features.table.clock import Clock, alternated
from cl_audit.predict.speed_table import LAYOUTS, PASSES, ConvCall

__all__ = ["conv_grid", "conv_key", "measure_conv"]

# Spatial size -> the channel counts models use at that size.
SIZES = {112: (16, 32, 64, 128), 56: (16, 32, 64, 128, 256), 28: (32, 64, 128, 256, 512),
         14: (64, 128, 256, 512, 1024), 7: (128, 256, 512, 1024, 2048)}  # fmt: skip


def _call(batch: int, cin: int, cout: int, groups: int, k: int, s: int, h: int) -> ConvCall:
    pad = k // 2 if s == 1 or k % 2 else 0
    out = (h + 2 * pad - k) // s + 1
    return ConvCall(batch, cin, h, h, cout, groups, k, s, out, out)


def conv_grid(batch: int) -> list[ConvCall]:
    """The grid's configurations at ``batch``, in their fixed shuffled order."""
    grid = []
    for h, channels in SIZES.items():
        for c in channels:
            for ratio in (0.25, 1, 4):
                grid.append(_call(batch, c, max(8, int(c * ratio)), 1, 1, 1, h))
            grid.append(_call(batch, c, 2 * c, 1, 1, 2, h))
            grid.append(_call(batch, c, c, 1, 3, 1, h))
            if c >= 64:
                grid.append(_call(batch, c, c // 2, 1, 3, 1, h))
            grid.append(_call(batch, c, 2 * c, 1, 3, 2, h))
            grid.extend(_call(batch, c, c, c, k, 1, h) for k in (3, 5, 7))
            grid.extend(_call(batch, c, c, c, k, 2, h) for k in (3, 5))
            for cpg in (4, 8, 16, 32, 64):
                if c >= 2 * cpg and c >= 32:
                    grid.append(_call(batch, c, c, c // cpg, 3, 1, h))
            for cpg in (16, 64):
                if c >= 2 * cpg:
                    grid.append(_call(batch, c, c, c // cpg, 3, 2, h))
    for k, s in ((3, 2), (7, 2), (4, 4), (16, 16), (3, 1)):
        for cout in (16, 32, 48, 64, 96, 128, 192, 384, 768):
            if k < 16 or cout >= 192:
                grid.append(_call(batch, 3, cout, 1, k, s, 224))
    random.Random(58).shuffle(grid)
    return grid


def conv_key(dtype: str, call: ConvCall) -> tuple[Any, ...]:
    """What names one measured configuration (the log's and the table's rows)."""
    return (dtype, *(getattr(call, f) for f in ConvCall.__dataclass_fields__))


def _padding(side: int, out: int, kernel: int, stride: int) -> int:
    return max(0, math.ceil(((out - 1) * stride + kernel - side) / 2))


def measure_conv(
    clock: Clock, device: str, dtype: torch.dtype, dtype_name: str, call: ConvCall, repeats: int
) -> dict[str, Any]:
    """``call``'s three passes in both layouts, alternated: a table row (milliseconds per
    pass per layout), its sides as this convolution made them."""
    k, s, g = call.kernel, call.stride, call.groups
    pad = [_padding(call.height, call.out_height, k, s), _padding(call.width, call.out_width, k, s)]
    args = ([s, s], pad, [1, 1], False, [0, 0], g)
    base_x = torch.randn(call.batch, call.cin, call.height, call.width, device=device, dtype=dtype)
    base_w = torch.randn(call.cout, call.cin // g, k, k, device=device, dtype=dtype)
    out = torch.ops.aten.convolution(base_x, base_w, None, *args)
    base_gy = torch.randn_like(out)
    calls = {}
    for layout in LAYOUTS:
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        x, w, gy = (t.contiguous(memory_format=fmt) for t in (base_x, base_w, base_gy))

        def fwd(x: torch.Tensor = x, w: torch.Tensor = w) -> object:
            return torch.ops.aten.convolution(x, w, None, *args)

        def dgrad(x: torch.Tensor = x, w: torch.Tensor = w, gy: torch.Tensor = gy) -> object:
            return torch.ops.aten.convolution_backward(gy, x, w, None, *args, [True, False, False])

        def wgrad(x: torch.Tensor = x, w: torch.Tensor = w, gy: torch.Tensor = gy) -> object:
            return torch.ops.aten.convolution_backward(gy, x, w, None, *args, [False, True, False])

        for fn in (fwd, dgrad, wgrad, fwd, dgrad, wgrad):
            fn()
        calls |= {f"{layout}:forward": fwd, f"{layout}:input_grad": dgrad,
                  f"{layout}:weight_grad": wgrad}  # fmt: skip
    timed = alternated(clock, calls, repeats, 1.0 if device == "cuda" else 5.0)
    made = ConvCall(call.batch, call.cin, call.height, call.width, call.cout, g, k, s,
                    out.shape[2], out.shape[3])  # fmt: skip
    row: dict[str, Any] = {"dtype": dtype_name} | {
        f: getattr(made, f) for f in ConvCall.__dataclass_fields__
    }
    for layout in LAYOUTS:
        row[layout] = {p: round(timed[f"{layout}:{p}"].ms, 5) for p in PASSES}
    return row
