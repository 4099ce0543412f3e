"""Measure the operation time table that cl-audit's speed prediction reads, on this machine.

    python scripts/op_times.py --device cpu --out reports/speed/cpu-raw.json     # measure
    python scripts/op_times.py --compact reports/speed/cpu-raw.json* \
        --out cl_audit/predict/tables/                          # the table cl-audit reads

Three parts, each written as it goes (a JSON line per measurement in ``<out>.jsonl``, the
whole table rewritten atomically after every part), so a run cut short keeps what it measured:

1. ``launch``: what one tiny operation costs the host (dispatch) and the device.
2. ``probes``: the operations around convolutions (activations, residual adds, batch, group and
   layer norm, pooling, resampling, softmax, concatenation, the layout conversions themselves),
   forward and backward, in both layouts at a few sizes; on CUDA each probe is also profiled
   once per layout (each aten operation's own device time and input shapes).
3. ``convolutions``: a grid of 2-D convolutions (dense 1x1 and 3x3, depthwise 3/5/7, grouped
   3x3 by channels per group, stems from 3 channels), forward, input gradient and weight
   gradient, each in channels_last and NCHW, alternated configuration by configuration; the
   grid is walked in a fixed shuffled order (seed 58) until ``--budget-s`` runs out.

Timing: CUDA events around ``reps`` calls after the calls were warmed (``cudnn.benchmark`` on,
as users set it: the first call of a shape autotunes), the host's own time per call beside;
the CPU the wall clock. Each number is the median of ``--repeats`` alternated measurements.
Nothing here imports cl-audit. ``--compact`` turns one or more raw files (a lease may measure
in parts; ``.gz`` too) into the table ``cl_audit.predict.speed_table`` reads, named by device,
torch release and backend library, with the machine written inside: the launch cost, each aten
operation's own time per call in the probes' profiles (device time on CUDA, CPU time on the
CPU) with its input's elements and channels, the dense and the converting copies, and the
convolution grid.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import random
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

FORMAT = 1
CL = torch.channels_last
LAYOUTS = ("channels_last", "nchw")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def backend(device: str) -> str:
    """The library that runs convolutions: cuDNN's version on CUDA, oneDNN's on the CPU."""
    if device == "cuda":
        v = torch.backends.cudnn.version() or 0
        return f"cudnn-{v // 10000}.{v // 100 % 100}"
    found = re.search(r"MKL-DNN v([\d.]+)", torch.__config__.show())
    return f"onednn-{found.group(1)}" if found else "onednn-unknown"


def machine(device: str) -> dict:
    about = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        about |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return about


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def device_slug(device: str) -> str:
    """The table's device name: the GPU's name on CUDA, ``cpu`` and its core count here."""
    if device == "cuda":
        name = torch.cuda.get_device_properties(0).name
        return "cuda-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"cpu-{os.cpu_count()}core"


def table_name(device: str) -> str:
    release = torch.__version__.split("+")[0]
    return f"{device_slug(device)}_torch-{release}_{backend(device)}.json"


class Clock:
    """Times ``reps`` calls: (device ms per call, host us per call); on the CPU both the wall
    clock."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, call: Callable[[], object], reps: int) -> tuple[float, float]:
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(reps):
                call()
            end.record()
            t1 = time.perf_counter()
            end.synchronize()
            return start.elapsed_time(end) / reps, (t1 - t0) / reps * 1e6
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        t1 = time.perf_counter()
        return (t1 - t0) / reps * 1e3, (t1 - t0) / reps * 1e6

    def reps_for(self, call: Callable[[], object], target_ms: float, most: int) -> int:
        """Calls per measurement so that one lasts about ``target_ms`` (the call warmed)."""
        once, _ = self.time(call, 1)
        return max(1, min(most, math.ceil(target_ms / max(once, 1e-3))))


def alternated(
    clock: Clock, calls: dict[str, Callable[[], object]], repeats: int, target_ms: float
) -> dict[str, dict]:
    """Each named call timed ``repeats`` times, the names alternating (the order reversed
    every other repeat); the median, the spread and the host's time of each."""
    reps = {name: clock.reps_for(call, target_ms, 200) for name, call in calls.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(clock.time(calls[name], reps[name]))
    return {
        name: {
            "ms": statistics.median(t for t, _ in ts),
            "min_ms": min(t for t, _ in ts),
            "max_ms": max(t for t, _ in ts),
            "host_us": statistics.median(h for _, h in ts),
            "reps": reps[name],
        }
        for name, ts in times.items()
    }


class Writer:
    """A JSON line per measurement, flushed; the whole table rewritten atomically on demand."""

    def __init__(self, out: Path, header: dict) -> None:
        self.out = out
        self.table = header | {"launch": None, "probes": [], "convolutions": []}
        self.lines = open(out.with_suffix(".jsonl"), "a", buffering=1)

    def add(self, part: str, row: dict) -> None:
        self.lines.write(json.dumps({"part": part, **row}) + "\n")
        if part == "launch":
            self.table["launch"] = row
        else:
            self.table[part].append(row)

    def save(self, **more: object) -> None:
        self.table |= more
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.table, indent=1) + "\n")
        os.replace(tmp, self.out)


# -- 1. launch -----------------------------------------------------------------------------


def measure_launch(clock: Clock, device: str) -> dict:
    """A chain of tiny additions: host microseconds per call, and the device's (on CUDA, the
    kernels queued back to back: the larger of the launch and the kernel); and a deep stack of
    tiny modules (a ReLU each), per module: a model's operation as Python calls it, under no
    gradient (``module_us``) and forward and backward (``module_step_us``)."""
    a = torch.ones(8, device=device)
    b = torch.ones(8, device=device)
    for _ in range(50):
        torch.add(a, b)
    ms, host = clock.time(lambda: torch.add(a, b), 2000)
    depth = 64
    stack = torch.nn.Sequential(*(torch.nn.ReLU() for _ in range(depth))).to(device)
    x = torch.ones(8, device=device, requires_grad=True)

    def forward() -> None:
        with torch.no_grad():
            stack(x)

    def step() -> None:
        stack(x).sum().backward()

    for call in (forward, step, forward, step):
        call()
    forward_ms, _ = clock.time(forward, 50)
    step_ms, _ = clock.time(step, 50)
    return {"host_us": host, "device_us": ms * 1e3, "module_us": forward_ms * 1e3 / depth,
            "module_step_us": step_ms * 1e3 / depth}  # fmt: skip


# -- 2. probes -----------------------------------------------------------------------------


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


PROBE_SHAPES = {
    "cuda": [(64, 64, 56, 56), (64, 256, 28, 28), (64, 512, 14, 14), (64, 1024, 7, 7)],
    "cpu": [(2, 64, 56, 56), (2, 256, 28, 28), (2, 512, 14, 14), (8, 32, 112, 112)],
}


def _in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.contiguous(memory_format=CL) if layout == "channels_last" else t.contiguous()


PROFILED_CALLS = 5  # a probe's step profiled this many times: each operation's time a mean


def _aten_profile(call: Callable[[], object], device: str) -> list[dict]:
    """Each aten operation's own time over ``PROFILED_CALLS`` profiled calls, with its input
    shapes (its calls counted: the table divides by them)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(PROFILED_CALLS):
            call()
        if device == "cuda":
            torch.cuda.synchronize()
    return profile_rows(prof, device)


def profile_rows(prof: torch.profiler.profile, device: str) -> list[dict]:
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0.0)
        if not e.key.startswith("aten::") or (device == "cuda" and dev <= 0):
            continue
        rows.append(
            {
                "op": e.key,
                "shapes": [list(s) for s in e.input_shapes] if e.input_shapes else [],
                "calls": e.count,
                "self_device_us": round(float(dev), 3) if device == "cuda" else None,
                "self_cpu_us": round(float(e.self_cpu_time_total), 3),
            }
        )
    return rows


def measure_probes(
    clock: Clock,
    device: str,
    dtype_name: str,
    writer: Writer,
    repeats: int,
    profile: bool,
    deadline: float,
) -> None:
    dtype = DTYPES[dtype_name]
    autocast = device == "cuda" and dtype != torch.float32
    for shape in PROBE_SHAPES[device]:
        c = shape[1]
        base_x = torch.randn(shape, device=device, dtype=dtype)
        base_y = torch.randn(shape, device=device, dtype=dtype)
        for name, probe in _probes(c, device, dtype).items():
            if time.monotonic() > deadline:
                return
            row: dict = {"probe": name, "dtype": dtype_name, "shape": list(shape)}
            try:
                calls = {}
                grads = {}
                for layout in LAYOUTS:
                    x = _in_layout(base_x, layout).requires_grad_(True)
                    y = _in_layout(base_y, layout).requires_grad_(True)

                    def forward(x=x, y=y, probe=probe) -> torch.Tensor:
                        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=autocast):
                            return probe(x, y)

                    def step(x=x, y=y, probe=probe, layout=layout, grads=grads) -> None:
                        with torch.autocast(device, dtype=dtype, enabled=autocast):
                            out = probe(x, y)
                        if layout not in grads:
                            grads[layout] = torch.randn_like(out)
                        out.backward(grads[layout])
                        x.grad = y.grad = None

                    out = forward()
                    row[f"{layout}_out"] = _layout_name(out)
                    for call in (forward, step, forward, step):
                        call()
                    calls[f"{layout}:forward"] = forward
                    calls[f"{layout}:step"] = step
                timed = alternated(clock, calls, repeats, 2.0)
                for layout in LAYOUTS:
                    fwd, both = timed[f"{layout}:forward"], timed[f"{layout}:step"]
                    row[layout] = {
                        "forward_ms": fwd["ms"],
                        "backward_ms": max(both["ms"] - fwd["ms"], 0.0),
                        "step_ms": both["ms"],
                        "forward_host_us": fwd["host_us"],
                        "step_host_us": both["host_us"],
                        "spread": [fwd["min_ms"], fwd["max_ms"], both["min_ms"], both["max_ms"]],
                    }
                    if profile:
                        row[layout]["profile"] = _aten_profile(calls[f"{layout}:step"], device)
            except Exception as e:  # a probe this torch cannot run is a row that says so
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            writer.add("probes", row)


def _layout_name(t: torch.Tensor) -> str:
    if t.dim() != 4:
        return f"{t.dim()}d"
    if t.is_contiguous():
        return "nchw"
    if t.is_contiguous(memory_format=CL):
        return "channels_last"
    return "strided"


# -- 3. convolutions -----------------------------------------------------------------------

# Spatial size -> the channel counts models use at that size.
SIZES = {112: (16, 32, 64, 128), 56: (16, 32, 64, 128, 256), 28: (32, 64, 128, 256, 512),
         14: (64, 128, 256, 512, 1024), 7: (128, 256, 512, 1024, 2048)}  # fmt: skip


def conv_grid(batch: int) -> list[dict]:
    """The configurations: (class, cin, cout, groups, kernel, stride, size, batch)."""
    grid = []

    def add(kind: str, cin: int, cout: int, groups: int, k: int, s: int, h: int) -> None:
        grid.append({"class": kind, "cin": cin, "cout": cout, "groups": groups, "kernel": k,
                     "stride": s, "size": h, "batch": batch})  # fmt: skip

    for h, channels in SIZES.items():
        for c in channels:
            for ratio in (0.25, 1, 4):
                add("dense", c, max(8, int(c * ratio)), 1, 1, 1, h)
            add("dense", c, 2 * c, 1, 1, 2, h)
            add("dense", c, c, 1, 3, 1, h)
            if c >= 64:
                add("dense", c, c // 2, 1, 3, 1, h)
            add("dense", c, 2 * c, 1, 3, 2, h)
            for k in (3, 5, 7):
                add("depthwise", c, c, c, k, 1, h)
            for k in (3, 5):
                add("depthwise", c, c, c, k, 2, h)
            for cpg in (4, 8, 16, 32, 64):
                if c >= 2 * cpg and c >= 32:
                    add("grouped", c, c, c // cpg, 3, 1, h)
            for cpg in (16, 64):
                if c >= 2 * cpg:
                    add("grouped", c, c, c // cpg, 3, 2, h)
    for k, s in ((3, 2), (7, 2), (4, 4), (16, 16), (3, 1)):
        for cout in (16, 32, 48, 64, 96, 128, 192, 384, 768):
            if k < 16 or cout >= 192:
                add("stem", 3, cout, 1, k, s, 224)
    random.Random(58).shuffle(grid)
    return grid


def measure_conv(clock: Clock, device: str, dtype: torch.dtype, cfg: dict, repeats: int) -> dict:
    n, cin, cout, g, k, s, h = (
        cfg[key] for key in ("batch", "cin", "cout", "groups", "kernel", "stride", "size")
    )
    pad = k // 2 if s == 1 or k % 2 else 0
    out = (h + 2 * pad - k) // s + 1
    args = ([s, s], [pad, pad], [1, 1], False, [0, 0], g)
    base_x = torch.randn(n, cin, h, h, device=device, dtype=dtype)
    base_w = torch.randn(cout, cin // g, k, k, device=device, dtype=dtype)
    base_gy = torch.randn(n, cout, out, out, device=device, dtype=dtype)
    calls = {}
    row = dict(cfg, out_size=out, padding=pad)
    for layout in LAYOUTS:
        x, w, gy = (_in_layout(t, layout) for t in (base_x, base_w, base_gy))

        def fwd(x=x, w=w):
            return torch.ops.aten.convolution(x, w, None, *args)

        def dgrad(x=x, w=w, gy=gy):
            return torch.ops.aten.convolution_backward(gy, x, w, None, *args, [True, False, False])

        def wgrad(x=x, w=w, gy=gy):
            return torch.ops.aten.convolution_backward(gy, x, w, None, *args, [False, True, False])

        row[f"{layout}_out"] = _layout_name(fwd())
        for call in (fwd, dgrad, wgrad, fwd, dgrad, wgrad):
            call()
        calls |= {f"{layout}:forward": fwd, f"{layout}:input_grad": dgrad,
                  f"{layout}:weight_grad": wgrad}  # fmt: skip
    timed = alternated(clock, calls, repeats, 1.0 if device == "cuda" else 5.0)
    for layout in LAYOUTS:
        row[layout] = {
            p: {"ms": timed[f"{layout}:{p}"]["ms"], "host_us": timed[f"{layout}:{p}"]["host_us"],
                "spread": [timed[f"{layout}:{p}"]["min_ms"], timed[f"{layout}:{p}"]["max_ms"]]}
            for p in ("forward", "input_grad", "weight_grad")
        }  # fmt: skip
    return row


def measure_convs(
    clock: Clock,
    device: str,
    dtype_name: str,
    writer: Writer,
    repeats: int,
    deadline: float,
    batch: int,
    every: int,
    skip: int = 0,
) -> int:
    dtype = DTYPES[dtype_name]
    done = 0
    for i, cfg in enumerate(conv_grid(batch)):
        if i % every or i < skip:
            continue
        if time.monotonic() > deadline:
            break
        cfg = dict(cfg, dtype=dtype_name)
        try:
            row = measure_conv(clock, device, dtype, cfg, repeats)
        except Exception as e:
            row = dict(cfg, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            if device == "cuda":
                torch.cuda.empty_cache()
        writer.add("convolutions", row)
        done += 1
    return done


# -- the table ----------------------------------------------------------------------------

TABLE_FORMAT, TABLE_VERSION = "cl-audit.speed-table", 1
# A probe's leaf gradient accumulated into the leaf's layout (``add_``, ``copy_``, ``fill_``)
# is the probe's own bookkeeping, no operation of a model's: left out of the operations' rows.
_BOOKKEEPING = {"aten::add_", "aten::copy_", "aten::fill_", "aten::zero_"}


def _elements(shapes: list[list[int]]) -> int:
    return sum(math.prod(s) for s in shapes if s)


def _op_rows(probe: dict, layout: str, device: str) -> list[dict]:
    """The operations of one probe's profiled step: each one's own time per call, with its
    inputs' elements and the map's channels; the copies of ``clone`` (dense) and
    ``to_other_layout`` (converting) as the two kinds of copy."""
    shape = probe["shape"]
    rows = []
    for r in probe[layout].get("profile", []):
        us = r["self_device_us"] if device == "cuda" else r["self_cpu_us"]
        if not us or r["calls"] < 1:
            continue
        op = r["op"]
        if op == "aten::copy_" and probe["probe"] in ("clone", "to_other_layout"):
            if probe["probe"] == "clone" and layout != "nchw":
                continue  # its leaf's gradient copied too: the NCHW clone alone is one copy
            op = "copy:dense" if probe["probe"] == "clone" else "copy:convert"
        elif op in _BOOKKEEPING:
            continue
        elif probe["probe"].endswith("_eval"):
            op += ":eval"  # the same operator in eval mode (running statistics): another cost
        elements = _elements(r["shapes"]) or 2 * math.prod(shape)  # cat lists its inputs
        rows.append({"op": op, "layout": layout, "dtype": probe["dtype"], "elements": elements,
                     "channels": shape[1], "us": round(us / r["calls"], 3)})  # fmt: skip
    return rows


def _host_per_op(raws: list[dict], device: str) -> dict[str, float]:
    """What each operation costs beyond its kernel, from the probes (median over them): on
    CUDA the host's time per kernel launched (the probe's host time over its kernels), on the
    CPU the wall time over the operations' own time, per operation; for a forward under no
    gradient and for a training step's forward and backward."""
    forward, step = [], []
    for raw in raws:
        for probe in raw["probes"]:
            for layout in LAYOUTS if "error" not in probe else ():
                timed, rows = probe[layout], probe[layout].get("profile", [])
                own = "self_device_us" if device == "cuda" else "self_cpu_us"
                per = raw.get("settings", {}).get("profiled_calls", 1)  # steps in a profile
                calls = sum(r["calls"] for r in rows) / per
                ahead = [r for r in rows if "backward" not in r["op"]
                         and r["op"] not in _BOOKKEEPING]  # fmt: skip
                ahead_calls = sum(r["calls"] for r in ahead) / per
                if not calls or not ahead_calls:
                    continue
                if device == "cuda":
                    step.append(timed["step_host_us"] / calls)
                    forward.append(timed["forward_host_us"] / ahead_calls)
                else:
                    spent = sum(r[own] for r in rows)
                    step.append(max(timed["step_ms"] * 1e3 - spent, 0.0) / calls)
                    spent = sum(r[own] for r in ahead)
                    forward.append(max(timed["forward_ms"] * 1e3 - spent, 0.0) / ahead_calls)
    launches = [raw["launch"] for raw in raws if raw.get("launch", {}).get("module_us")]
    if device == "cpu" and launches:  # the profiler's own cost hides the CPU's: a module's
        return {
            "forward_us": round(statistics.median(x["module_us"] for x in launches), 3),
            "step_us": round(statistics.median(x["module_step_us"] for x in launches), 3),
            "basis": "a deep stack of tiny modules, per module (op_times.measure_launch)",
        }
    if not step:
        return {}
    return {"forward_us": round(statistics.median(forward), 3),
            "step_us": round(statistics.median(step), 3),
            "basis": "the probes' host time per kernel launched"}  # fmt: skip


def _conv_row(c: dict) -> dict:
    keep = ("dtype", "cin", "cout", "groups", "kernel", "stride", "size", "out_size", "batch")
    row = {k: c[k] for k in keep}
    for layout in LAYOUTS:
        row[layout] = {p: round(v["ms"], 5) for p, v in c[layout].items()}
    return row


def compact(paths: list[Path], out: Path) -> Path:
    """One table from raw files of one device, torch release and backend (``--compact``)."""
    raws = []
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            raws.append(json.load(f))
    first = raws[0]
    for raw in raws[1:]:
        for key in ("device", "backend", "torch"):
            if raw[key] != first[key]:
                sys.exit(f"op_times --compact: {key} differs: {raw[key]} against {first[key]}")
    device = first["device"]
    name = f"{device_slug_of(first)}_torch-{first['torch'].split('+')[0]}_{first['backend']}"
    ops, convs, seen = [], [], set()
    for raw in raws:
        for probe in raw["probes"]:
            if "error" not in probe:
                for layout in LAYOUTS:
                    ops += _op_rows(probe, layout, device)
        for c in raw["convolutions"]:
            key = tuple(c[k] for k in ("dtype", "cin", "cout", "groups", "kernel", "stride",
                                       "size", "batch"))  # fmt: skip
            if "error" not in c and key not in seen:
                seen.add(key)
                convs.append(_conv_row(c))
    launches = [raw["launch"] for raw in raws if raw.get("launch")]
    table = {
        "format": TABLE_FORMAT,
        "version": TABLE_VERSION,
        "name": name,
        "device": device,
        "backend": first["backend"],
        "torch": first["torch"],
        "machine": first["machine"],
        "measured": sorted(raw["measured"] for raw in raws),
        "script": [raw["script"] for raw in raws],
        "settings": first["settings"],
        "launch": {
            k: round(statistics.median(x[k] for x in launches), 3) for k in ("host_us", "device_us")
        },
        "host": _host_per_op(raws, device),
        "ops": ops,
        "convolutions": convs,
    }
    target = out / f"{name}.json" if out.is_dir() else out
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=0, separators=(",", ":")) + "\n")
    os.replace(tmp, target)
    return target


def device_slug_of(raw: dict) -> str:
    if raw["device"] == "cuda":
        return "cuda-" + re.sub(r"[^a-z0-9]+", "-", raw["machine"]["gpu"].lower()).strip("-")
    return f"cpu-{raw['machine']['cores']}core"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--out", type=Path, required=True, help="a .json file or a folder")
    p.add_argument("--compact", type=Path, nargs="+", help="raw files: make the table of them")
    p.add_argument("--dtypes", default=None, help="default: float16,bfloat16,float32 on "
                   "CUDA (the grid's share 1, 1/4, 1/4), float32 on the CPU")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=600.0, help="the convolution grid's time")
    p.add_argument("--probe-budget-s", type=float, default=120.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=None, help="the grid's batch (64 / 2)")
    p.add_argument("--threads", type=int, default=None, help="torch's CPU threads")
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        help="start at this grid configuration (where an earlier run stopped)",
    )
    p.add_argument(
        "--every",
        type=int,
        default=None,
        help="every Nth grid configuration, each "
        "dtype (default: CUDA's first dtype all, the others every fourth)",
    )
    a = p.parse_args()
    if a.compact:
        print(f"wrote {compact(a.compact, a.out)}")
        return
    if a.device is None:
        sys.exit("op_times: --device cpu|cuda (or --compact RAW...)")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("op_times: --device cuda, and torch sees no GPU")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cudnn.benchmark = True
    out = a.out / table_name(a.device) if a.out.is_dir() else a.out
    dtypes = a.dtypes or ("float16,bfloat16,float32" if a.device == "cuda" else "float32")
    dtypes = dtypes.split(",")
    batch = a.batch or (64 if a.device == "cuda" else 2)
    start = time.monotonic()
    header = {
        "format": FORMAT,
        "name": out.name,
        "device": a.device,
        "backend": backend(a.device),
        "torch": torch.__version__,
        "machine": machine(a.device),
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "script": "scripts/op_times.py " + " ".join(sys.argv[1:]),
        "settings": {
            "cudnn_benchmark": True,
            "repeats": a.repeats,
            "grid_batch": batch,
            "tf32_convolutions": torch.backends.cudnn.allow_tf32,
            "autocast_probes": a.device == "cuda",
            "profiled_calls": PROFILED_CALLS,
        },
    }
    writer = Writer(out, header)
    clock = Clock(a.device)
    writer.add("launch", measure_launch(clock, a.device))
    writer.save()
    print(f"launch: {writer.table['launch']}", flush=True)
    for dt in dtypes:
        deadline = time.monotonic() + a.probe_budget_s / len(dtypes)
        measure_probes(clock, a.device, dt, writer, a.repeats, True, deadline)
        writer.save()
        print(f"probes {dt}: {time.monotonic() - start:.0f} s", flush=True)
    if a.every:
        shares = [1 / a.every] * len(dtypes)
    elif a.device == "cuda":
        shares = [1.0] + [0.25] * (len(dtypes) - 1)
    else:
        shares = [1.0] * len(dtypes)
    for dt, share in zip(dtypes, shares, strict=True):
        budget = a.budget_s * share / sum(shares)
        done = measure_convs(clock, a.device, dt, writer, a.repeats, time.monotonic() + budget,
                             batch, round(1 / share), a.skip)  # fmt: skip
        writer.save()
        print(f"convolutions {dt}: {done} in {time.monotonic() - start:.0f} s", flush=True)
    writer.save(seconds=round(time.monotonic() - start, 1))
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
