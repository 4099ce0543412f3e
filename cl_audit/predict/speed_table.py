"""One operation time table, as the speed prediction reads it, and the lookups in it. Tables
are made by ``cl-audit table`` (``features.table``) on the machine they describe, and kept by
``predict.table_store``.

A table holds, for one machine (``identity``), torch release and backend library: what the
host spends per operation, by kind (``HostCosts``); each aten operation's own time per call in
the probes (device time on a GPU, CPU time on the CPU), with its input's elements and the map's
channels, in each layout; the dense and the converting copy; and convolutions, forward and both
gradients, in each layout: a general grid and the exact configurations of the models it was
made for. An operation is looked up among the samples of its own name, layout and dtype (the
one nearest in channels, scaled by elements); a convolution measured exactly is read, any other
from the configurations nearest it of its kind, kernel and stride, scaled by their work.
Nothing measured stands in silently for what was not: a lookup without samples answers None,
and the caller says what it put in its place.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

from cl_audit.report.codec import decode
from cl_audit.report.envelope import TABLE_FORMAT, TABLE_VERSION
from cl_audit.report.machine import MachineIdentity

__all__ = [
    "LAYOUTS",
    "PASSES",
    "TABLE_FORMAT",
    "TABLE_VERSION",
    "ConvCall",
    "HostCosts",
    "SpeedTable",
    "kernel_name",
]

LAYOUTS = ("channels_last", "nchw")
PASSES = ("forward", "input_grad", "weight_grad")
# operations whose kernel the probes measured under another name (the profiler names the inner
# operation that ran it)
_SAME_KERNEL = {"aten::relu": "aten::clamp_min", "aten::relu_": "aten::clamp_min",
                "aten::hardtanh_": "aten::clamp_min", "aten::hardtanh": "aten::clamp_min",
                "aten::sub": "aten::add", "aten::sub_": "aten::add",
                "aten::_native_batch_norm_legit_no_training:eval": "aten::native_batch_norm:eval",
                "aten::cudnn_batch_norm:eval": "aten::native_batch_norm:eval"}  # fmt: skip
_NEIGHBOURS = 4  # configurations an unmeasured convolution's time is taken from


def kernel_name(op: str) -> str:
    """The name the profiler gives the kernel ``op`` runs (an in-place form runs its
    out-of-place kernel; relu is clamp_min's), ``op`` itself where that is all it is."""
    return _SAME_KERNEL.get(op) or (op[:-1] if op.endswith("_") else op)


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


@dataclass(frozen=True)
class HostCosts:
    """Microseconds the host spends on one operation beyond its kernel, by kind, as measured on
    the table's machine: a forward's under no gradient; a training step's forward (autograd
    records it), backward (the engine runs its node) and optimizer operations; a view (no
    kernel) without and with autograd; a synchronisation on an idle device. ``basis`` says how
    they were measured."""

    forward: float
    forward_grad: float
    backward: float
    optimizer: float
    view: float
    view_grad: float
    sync: float
    basis: str = ""


class _Place(NamedTuple):
    """A convolution's place for ``_distance``: log2 of its output positions, of its input
    channels per group and of its output channels; its kind; log2 of its kernel; strided."""

    work: float
    cin: float
    cout: float
    kind: str
    kernel: float
    strided: bool


@dataclass(frozen=True)
class _ConvPoint:
    call: ConvCall
    times: dict[str, dict[str, float]]  # layout -> pass -> ms (a pass may be missing)
    place: _Place


class SpeedTable:
    """One table, read once (``data``: its JSON document, checked by ``table_store``);
    ``source`` says where it came from (``shipped``, or its file)."""

    def __init__(self, data: dict[str, Any], source: str = "shipped") -> None:
        if data.get("format") != TABLE_FORMAT or data.get("version") != TABLE_VERSION:
            raise ValueError(f"not a version-{TABLE_VERSION} {TABLE_FORMAT} document")
        self.source = source
        self.name: str = data["name"]
        self.identity = decode(MachineIdentity, data["identity"])
        self.device: str = self.identity.device
        self.asynchronous = self.device != "cpu"  # a GPU runs kernels while the host goes on
        self.measured: str = data.get("measured", "")
        self.made_by: str = data.get("made_by", "")
        self.seconds: float = data.get("seconds", 0.0)
        self.models: tuple[str, ...] = tuple(data.get("models", ()))
        host = dict(data["host"])
        self.host = HostCosts(**{k: host[k] for k in HostCosts.__dataclass_fields__ if k in host})
        self.calibration: dict[str, Any] | None = data.get("calibration")
        self._ops: dict[tuple[str, str, str], list[tuple[int, int, float]]] = defaultdict(list)
        for row in data["ops"]:
            key = (row["op"], row["layout"], row["dtype"])
            self._ops[key].append((row["elements"], row["channels"], row["us"]))
        times = [us for rows in self._ops.values() for _, _, us in rows]
        self.floor_us = min(times) if times else 0.0  # the shortest operation measured
        self._convs: dict[tuple[str, str], list[_ConvPoint]] = defaultdict(list)
        self._exact: dict[tuple[ConvCall, str], _ConvPoint] = {}
        for c in data["convolutions"]:
            call = ConvCall(c["batch"], c["cin"], c["height"], c["width"], c["cout"], c["groups"],
                            c["kernel"], c["stride"], c["out_height"], c["out_width"])  # fmt: skip
            point = _ConvPoint(call, {layout: c[layout] for layout in LAYOUTS}, _place(call))
            self._exact[(call, c["dtype"])] = point
            for p in PASSES:
                if all(p in point.times[layout] for layout in LAYOUTS):
                    self._convs[(c["dtype"], p)].append(point)

    @property
    def described(self) -> str:
        """The table as reports name it: its name and the machine that measured it."""
        return f"{self.name} (measured on {self.identity.described()})"

    def dtypes(self) -> set[str]:
        return {dtype for dtype, _ in self._convs} | {dtype for _, _, dtype in self._ops}

    def has_convolutions(self, dtype: str) -> bool:
        return (dtype, "forward") in self._convs

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per dtype: (convolution configurations, operation samples)."""
        out = {}
        for dtype in sorted(self.dtypes()):
            convs = len(self._convs.get((dtype, "forward"), ()))
            ops = sum(len(rows) for (_, _, d), rows in self._ops.items() if d == dtype)
            out[dtype] = (convs, ops)
        return out

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
            found = [self.op_us(op, lay, dtype, elements, channels) for lay in LAYOUTS]
            return sum(u for u in found if u is not None) / len(found) if all(found) else None
        samples = self._ops.get((op, layout, dtype))
        if not samples:
            samples = self._ops.get((kernel_name(op), layout, dtype))
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
        ``weight_grad``): as measured where the table holds this very configuration, else from
        the nearest configurations of its kind, kernel and stride (else of any), each scaled
        by the work (the part above the shortest measured); None without a configuration of
        ``dtype``."""
        exact = self._exact.get((call, dtype))
        if exact is not None and passes in exact.times[layout]:
            return exact.times[layout][passes]
        points = self._convs.get((dtype, passes))
        if not points:
            return None
        here = _place(call)
        near = heapq.nsmallest(_NEIGHBOURS, ((_distance(here, p.place), p) for p in points),
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
        return min(p.times[layout][passes] for p in self._convs[(dtype, passes)])


def _distance(a: _Place, b: _Place) -> float:
    """How unlike two convolutions are: work shape in log2 steps, kind, kernel and stride."""
    d = abs(a.work - b.work) + abs(a.cin - b.cin) + abs(a.cout - b.cout)
    return (
        d
        + 3.0 * (a.kind != b.kind)
        + abs(a.kernel - b.kernel) * 2.0
        + 2.0 * (a.strided != b.strided)
    )


def _place(c: ConvCall) -> _Place:
    def log(x: float) -> float:
        return math.log2(max(x, 1.0))

    return _Place(
        log(c.batch * c.out_height * c.out_width),
        log(c.cin // max(c.groups, 1)),
        log(c.cout),
        c.kind,
        log(c.kernel),
        c.stride > 1,
    )
