"""The operations around convolutions, measured for ``cl-audit table``: activations, residual
adds, batch, group and layer norm, pooling, resampling, softmax, concatenation and the layout
conversions themselves, forward and backward, in both layouts, each profiled so that every
aten operation it runs gets its own time per call (device time on a GPU, CPU time on the CPU)
with its inputs' elements and the map's channels: the table's ``ops`` rows."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from cl_audit.execution.timing import Profiler
from cl_audit.features.table.clock import Clock, alternated
from cl_audit.predict.speed_table import LAYOUTS

__all__ = ["PROBE_SHAPES", "measure_probe", "op_rows", "probe_names"]

CL = torch.channels_last
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
PROBE_SHAPES = {
    "cuda": [(64, 64, 56, 56), (64, 256, 28, 28), (64, 512, 14, 14), (64, 1024, 7, 7)],
    "cpu": [(2, 64, 56, 56), (2, 256, 28, 28), (2, 512, 14, 14), (8, 32, 112, 112)],
}
PROFILED_CALLS = 5  # a probe's step profiled this many times: each operation's time a mean
# A probe's leaf gradient accumulated into the leaf's layout (``add_``, ``copy_``, ``fill_``)
# is the probe's own bookkeeping, no operation of a model's: left out of the operations' rows.
_BOOKKEEPING = {"aten::add_", "aten::copy_", "aten::fill_", "aten::zero_"}


def _probes(c: int, device: str, dtype: torch.dtype) -> dict[str, Callable[..., torch.Tensor]]:
    """Operations of a (N, C, H, W) map ``x`` (and ``y``, another map of the same layout), as
    models call them; norms' parameters in float32 as under autocast."""
    f32 = {"device": device, "dtype": torch.float32}
    weight, bias = torch.ones(c, **f32), torch.zeros(c, **f32)
    mean, var = torch.zeros(c, **f32), torch.ones(c, **f32)
    scale = torch.rand(1, c, 1, 1, device=device, dtype=dtype)
    groups = 32 if c % 32 == 0 else 1
    return {
        "relu": lambda x, y: F.relu(x),
        "silu": lambda x, y: F.silu(x),
        "gelu": lambda x, y: F.gelu(x),
        "add": lambda x, y: x + y,
        "mul_channel_scale": lambda x, y: x * scale,
        "batch_norm": lambda x, y: F.batch_norm(x, None, None, weight, bias, training=True),
        "batch_norm_eval": lambda x, y: F.batch_norm(x, mean, var, weight, bias, training=False),
        "group_norm": lambda x, y: F.group_norm(x, groups, weight, bias),
        "layer_norm_channels": lambda x, y: F.layer_norm(
            x.permute(0, 2, 3, 1), (c,), weight, bias
        ).permute(0, 3, 1, 2),
        "max_pool_3s2": lambda x, y: F.max_pool2d(x, 3, 2, 1),
        "avg_pool_2s2": lambda x, y: F.avg_pool2d(x, 2, 2),
        "global_avg_pool": lambda x, y: F.adaptive_avg_pool2d(x, 1),
        "upsample_nearest_2x": lambda x, y: F.interpolate(x, scale_factor=2.0, mode="nearest"),
        "upsample_bilinear_2x": lambda x, y: F.interpolate(
            x, scale_factor=2.0, mode="bilinear", align_corners=False
        ),
        "softmax_channels": lambda x, y: torch.softmax(x, 1),
        "cat_channels": lambda x, y: torch.cat([x, y], 1),
        "to_other_layout": lambda x, y: (
            x.contiguous()
            if x.is_contiguous(memory_format=CL) and not x.is_contiguous()
            else x.contiguous(memory_format=CL)
        ),
        "clone": lambda x, y: x.clone(),
    }


def probe_names() -> tuple[str, ...]:
    return tuple(_probes(32, "cpu", torch.float32))


def _in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.contiguous(memory_format=CL) if layout == "channels_last" else t.contiguous()


def measure_probe(
    clock: Clock, device: str, dtype_name: str, name: str, shape: tuple[int, ...], repeats: int
) -> dict[str, Any]:
    """One probe at one shape, forward and training step, both layouts alternated, then each
    layout's step profiled (``op_rows`` reads it)."""
    dtype = DTYPES[dtype_name]
    autocast = device == "cuda" and dtype != torch.float32
    probe = _probes(shape[1], device, dtype)[name]
    base_x = torch.randn(shape, device=device, dtype=dtype)
    base_y = torch.randn(shape, device=device, dtype=dtype)
    row: dict[str, Any] = {"probe": name, "dtype": dtype_name, "shape": list(shape)}
    calls: dict[str, Callable[[], object]] = {}
    grads: dict[str, torch.Tensor] = {}
    for layout in LAYOUTS:
        x = _in_layout(base_x, layout).requires_grad_(True)
        y = _in_layout(base_y, layout).requires_grad_(True)

        def forward(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=autocast):
                return probe(x, y)

        def step(x: torch.Tensor = x, y: torch.Tensor = y, layout: str = layout) -> None:
            with torch.autocast(device, dtype=dtype, enabled=autocast):
                out = probe(x, y)
            if layout not in grads:
                grads[layout] = torch.randn_like(out)
            out.backward(grads[layout])
            x.grad = y.grad = None

        for call in (forward, step, forward, step):
            call()
        calls[f"{layout}:forward"] = forward
        calls[f"{layout}:step"] = step
    timed = alternated(clock, calls, repeats, 2.0)
    for layout in LAYOUTS:
        fwd, both = timed[f"{layout}:forward"], timed[f"{layout}:step"]
        row[layout] = {
            "forward_ms": fwd.ms,
            "step_ms": both.ms,
            "spread": [fwd.min_ms, fwd.max_ms, both.min_ms, both.max_ms],
            "profile": _aten_profile(calls[f"{layout}:step"], device),
        }
    return row


def _aten_profile(call: Callable[[], object], device: str) -> list[dict[str, Any]]:
    """Each aten operation's own time over ``PROFILED_CALLS`` profiled calls, with its input
    shapes (its calls counted: the rows divide by them)."""
    with Profiler(torch.device(device), shapes=True, times=True) as profiler:
        for _ in range(PROFILED_CALLS):
            call()
        if device == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in profiler.events().key_averages(group_by_input_shapes=True):
        own = getattr(e, "self_device_time_total", 0.0) if device == "cuda" else (
            e.self_cpu_time_total
        )  # fmt: skip
        if e.key.startswith("aten::") and own > 0:
            shapes = [list(s) for s in e.input_shapes] if e.input_shapes else []
            rows.append({"op": e.key, "shapes": shapes, "calls": e.count, "us": float(own)})
    return rows


def op_rows(probe: dict[str, Any]) -> list[dict[str, Any]]:
    """The operations of one probe's profiled steps: each one's own time per call, with its
    inputs' elements and the map's channels and shape; the copies of ``clone`` (dense) and
    ``to_other_layout`` (converting) as the two kinds of copy."""
    shape = probe["shape"]
    rows = []
    for layout in LAYOUTS:
        for r in probe[layout]["profile"]:
            op = r["op"]
            if op == "aten::copy_" and probe["probe"] in ("clone", "to_other_layout"):
                if probe["probe"] == "clone" and layout != "nchw":
                    continue  # its leaf's gradient copied too: the NCHW clone alone is one copy
                op = "copy:dense" if probe["probe"] == "clone" else "copy:convert"
            elif op in _BOOKKEEPING:
                continue
            elif probe["probe"].endswith("_eval"):
                op += ":eval"  # the same operator in eval mode (running statistics): another cost
            elements = sum(math.prod(s) for s in r["shapes"] if s) or 2 * math.prod(shape)
            rows.append({"op": op, "layout": layout, "dtype": probe["dtype"],
                         "elements": elements, "channels": shape[1], "shape": shape,
                         "us": round(r["us"] / r["calls"], 3)})  # fmt: skip
    return rows
