"""The operation time tables the speed prediction reads (``tables/*.json``, made by
``scripts/op_times.py`` on the device they describe), and the lookups in one.

A table holds, for one device, torch release and backend library: the host's cost of one
operation; each aten operation's own time per call in the probes of ``op_times.py`` (device
time on CUDA, CPU time on the CPU), with its inputs' elements and the map's channels, in each
layout; the dense and the converting copy; and a grid of convolutions, forward and both
gradients, in each layout. An operation is looked up among the samples of its own name,
layout and dtype (the one nearest in channels, scaled by elements); a convolution among the
grid's configurations of its kind, kernel and stride (the nearest few, scaled by their work).
Nothing measured stands in silently for what was not: a lookup without samples answers None,
and the caller says what it put in its place.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["TABLE_FORMAT", "ConvCall", "SpeedTable", "load_table", "table_for", "tables"]

TABLE_FORMAT = "cl-audit.speed-table"
_LAYOUTS = ("channels_last", "nchw")
# operations whose kernel the probes measured under another name (the profiler names the inner
# operation that ran it)
_SAME_KERNEL = {"aten::relu": "aten::clamp_min", "aten::relu_": "aten::clamp_min",
                "aten::hardtanh_": "aten::clamp_min", "aten::hardtanh": "aten::clamp_min",
                "aten::sub": "aten::add", "aten::sub_": "aten::add",
                "aten::_native_batch_norm_legit_no_training:eval": "aten::native_batch_norm:eval",
                "aten::cudnn_batch_norm:eval": "aten::native_batch_norm:eval"}  # fmt: skip
_NEIGHBOURS = 4  # grid configurations a convolution's time is taken from


@dataclass(frozen=True)
class ConvCall:
    """One convolution as a run saw it: batch, input channels, input side (height and width),
    output channels, groups, kernel side, stride, output side."""

    batch: int
    cin: int
    height: int
    width: int
    cout: int
    groups: int
    kernel: int
    stride: int
    out_height: int
    out_width: int

    @property
    def flops(self) -> float:
        out = self.batch * self.out_height * self.out_width * self.cout
        return 2.0 * out * (self.cin // max(self.groups, 1)) * self.kernel**2

    @property
    def kind(self) -> str:
        per_group = self.cin // max(self.groups, 1)
        if self.cin == 3 and self.groups == 1:
            return "stem"
        if self.groups > 1 and per_group == 1:
            return "depthwise"
        return "grouped" if self.groups > 1 else "dense"


_Features = tuple[float, float, float, str, float, bool]


@dataclass(frozen=True)
class _ConvPoint:
    call: ConvCall
    dtype: str
    times: dict[str, dict[str, float]]  # layout -> pass -> ms
    features: _Features


class SpeedTable:
    """One table, read once: ``name`` says what it is (device, torch, backend)."""

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("format") != TABLE_FORMAT or data.get("version") != 1:
            raise ValueError(f"{data.get('name')}: not a version-1 speed table")
        self.name: str = data["name"]
        self.device: str = data["device"]
        self.machine: dict[str, Any] = data["machine"]
        self.launch_us: float = data["launch"]["host_us"]  # a bare operation's host time
        host = data.get("host") or {}
        # What each operation of a forward, or of a training step, costs beyond its kernel
        # (at least a bare operation's launch), and how much of the kernels' time the step
        # waits for beside it (1: all of it, as on the CPU, where nothing runs ahead).
        self.host_us = {
            train: max(host.get("step_us" if train else "forward_us", 0.0), self.launch_us)
            for train in (False, True)
        }
        self.overlap: float = host.get("overlap", 1.0)
        self.host_basis: str | None = host.get("basis")
        self._ops: dict[tuple[str, str, str], list[tuple[int, int, float]]] = defaultdict(list)
        for row in data["ops"]:
            key = (row["op"], row["layout"], row["dtype"])
            self._ops[key].append((row["elements"], row["channels"], row["us"]))
        times = [us for rows in self._ops.values() for _, _, us in rows]
        self.floor_us = min(times) if times else 0.0  # the shortest operation measured
        self._convs: dict[str, list[_ConvPoint]] = defaultdict(list)
        for c in data["convolutions"]:
            call = ConvCall(c["batch"], c["cin"], c["size"], c["size"], c["cout"], c["groups"],
                            c["kernel"], c["stride"], c["out_size"], c["out_size"])  # fmt: skip
            times = {layout: c[layout] for layout in ("channels_last", "nchw")}
            self._convs[c["dtype"]].append(_ConvPoint(call, c["dtype"], times, _features(call)))

    @property
    def described(self) -> str:
        """The table as reports name it: its name and the machine that measured it."""
        m = self.machine
        what = m.get("gpu") or m.get("processor") or "?"
        return f"{self.name} (measured on {what}, {m.get('cores', '?')} CPU cores)"

    def dtypes(self) -> set[str]:
        return set(self._convs) | {dtype for _, _, dtype in self._ops}

    def op_us(
        self, op: str, layout: str, dtype: str, elements: int, channels: int, dense: bool = False
    ) -> float | None:
        """Microseconds of one call of ``op`` (``aten::name``, or ``copy:dense`` and
        ``copy:convert``) with ``elements`` input elements: the sample of the nearest channel
        count (then elements), scaled by elements; None without a sample (an eval batch norm
        without eval samples included: the caller prices it as an elementwise pass).
        ``dense``: an elementwise operation, which reads and writes dense memory alike in
        either layout: the mean of both layouts' samples."""
        if dense:
            found = [self.op_us(op, lay, dtype, elements, channels) for lay in _LAYOUTS]
            return sum(u for u in found if u is not None) / len(found) if all(found) else None
        samples = self._ops.get((op, layout, dtype))
        if not samples:  # an in-place form runs its out-of-place kernel; relu is clamp_min's
            same = _SAME_KERNEL.get(op) or (op[:-1] if op.endswith("_") else None)
            samples = self._ops.get((same, layout, dtype)) if same else None
        if not samples:
            return None
        e, _, us = min(
            samples,
            key=lambda s: (abs(math.log2(max(s[1], 1) / max(channels, 1))),
                           abs(math.log2(max(s[0], 1) / max(elements, 1)))),
        )  # fmt: skip
        return max(self.floor_us, us * elements / max(e, 1))

    @functools.lru_cache(maxsize=8192)  # noqa: B019 - a model repeats its convolutions
    def conv_ms(self, call: ConvCall, dtype: str, layout: str, passes: str) -> float | None:
        """Milliseconds of one convolution's ``passes`` (``forward``, ``input_grad``,
        ``weight_grad``): from the nearest grid configurations of its kind, kernel and stride
        (else of any), each scaled by the work (the part above the shortest measured); None
        without a configuration of ``dtype``."""
        points = self._convs.get(dtype)
        if not points:
            return None
        here = _features(call)
        near = heapq.nsmallest(_NEIGHBOURS, ((_distance(here, p.features), p) for p in points),
                               key=lambda d_p: d_p[0])  # fmt: skip
        floor = self._conv_floor(dtype, layout, passes)
        total, weights = 0.0, 0.0
        for distance, p in near:
            measured = p.times[layout][passes]
            weight = 1.0 / (0.25 + distance)
            scaled = floor + max(measured - floor, 0.0) * call.flops / max(p.call.flops, 1.0)
            total += weight * math.log(max(scaled, 1e-6))
            weights += weight
        return math.exp(total / weights)

    @functools.cache  # noqa: B019 - one per table, which lives as long as the process
    def _conv_floor(self, dtype: str, layout: str, passes: str) -> float:
        return min(p.times[layout][passes] for p in self._convs[dtype])


def _distance(a: _Features, b: _Features) -> float:
    """How unlike two convolutions are: work shape in log2 steps, kind, kernel and stride."""
    d = abs(a[0] - b[0]) + abs(a[1] - b[1]) + abs(a[2] - b[2])
    return d + 3.0 * (a[3] != b[3]) + abs(a[4] - b[4]) * 2.0 + 2.0 * (a[5] != b[5])


def _features(c: ConvCall) -> _Features:
    """A convolution's place for ``_distance``: log2 of its output positions, of its input
    channels per group and of its output channels; its kind; log2 of its kernel; strided."""

    def log(x: float) -> float:
        return math.log2(max(x, 1.0))

    work = log(c.batch * c.out_height * c.out_width)
    return work, log(c.cin // max(c.groups, 1)), log(c.cout), c.kind, log(c.kernel), c.stride > 1


@functools.cache
def tables() -> tuple[SpeedTable, ...]:
    """Every table shipped, read once."""
    folder = resources.files("cl_audit.predict").joinpath("tables")
    found = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            found.append(SpeedTable(json.loads(entry.read_text())))
    return tuple(found)


def load_table(text: str) -> SpeedTable:
    return SpeedTable(json.loads(text))


def table_for(device_type: str) -> SpeedTable | None:
    """The table of ``device_type`` (``cpu``, ``cuda``); None where none was measured. Of
    several, the last by name (the newest torch release of the same device)."""
    found = [t for t in tables() if t.device == device_type]
    return found[-1] if found else None
