"""The time a run's operations take on a device, predicted from its speed table: the per-operation
model behind a predicted speed verdict.

The cost ledger hands every operation of a run to an ``OpTimes`` (``observe``), which keeps,
in order, what the model needs and nothing else: each operation's name, its input's shape,
elements, channels and layout; each convolution's shape and passes; each matrix product's and
attention's size; whether it synchronises; the phase it ran in. ``predict`` then prices each
operation with a ``SpeedTable``:

- a convolution (forward, input gradient, weight gradient) from the table's grid, by its kind,
  kernel, stride and work, in the layout its input ran in (a configuration the table measured
  exactly is looked up);
- a matrix product as the 1x1 channels_last convolution of the same sizes (the same GEMM);
  attention as its products (two per query, key and value head forward, five backward);
- a copy at the dense or the converting copy's rate, by whether it changes the layout; the
  conversions inside kernels (the ledger's) at the converting copy's rate;
- every other operation from the table's samples of its own name and layout, scaled by its
  elements; an operation the table never measured at the elementwise ``aten::add``'s rate,
  counted in ``StepTime.stand_ins`` (and reported) rather than silently.

Each operation also costs the host its own time (Python, dispatch, autograd's record, the
launch), which the table measured on its machine per kind of operation: a forward's under no
gradient, a training step's forward, backward and optimizer operations, views, and waiting at
a synchronisation. The step is then the queue of both (``predict.queue``): on the CPU the host
runs each kernel itself; on a GPU it enqueues them while the device runs the ones before.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

import torch

from cl_audit.compat.operators import aten_op_name, op_traits
from cl_audit.enums import Phase, SpeedClass
from cl_audit.predict.queue import Issued, replay
from cl_audit.predict.speed_table import ConvCall, HostCosts, SpeedTable
from cl_audit.registry import OpClass, lookup
from cl_audit.report.stages import ROOT, StageCut

__all__ = ["OpTimes", "StepTime", "predict", "speed_kind"]

_CL = torch.channels_last


class _Kind(Enum):
    """How the model prices an operator (decided once per operator, ``speed_kind``)."""

    CONV = "conv"
    CONV_BACKWARD = "conv backward"
    MATMUL = "matmul"
    ATTENTION = "attention"
    ATTENTION_BACKWARD = "attention backward"
    COPY = "copy"
    VIEW = "view"  # no kernel: the host's time alone
    SYNC = "sync"  # the host waits for the device (a value read back, a data-dependent size)
    TABLE = "table"  # from the table's samples of its name


# how each declared class is priced, and the class its time falls in (``registry.OpClass``)
_PRICED = {
    OpClass.CONVOLUTION: (_Kind.CONV, SpeedClass.CONV_FORWARD),
    OpClass.CONVOLUTION_BACKWARD: (_Kind.CONV_BACKWARD, SpeedClass.CONV_FORWARD),
    OpClass.MATRIX_PRODUCT: (_Kind.MATMUL, SpeedClass.OTHER),
    OpClass.ATTENTION: (_Kind.ATTENTION, SpeedClass.ATTENTION),
    OpClass.ATTENTION_BACKWARD: (_Kind.ATTENTION_BACKWARD, SpeedClass.ATTENTION),
    OpClass.COPY: (_Kind.COPY, SpeedClass.ELEMENTWISE),
    OpClass.COPY_INTO: (_Kind.COPY, SpeedClass.ELEMENTWISE),
    OpClass.SYNC: (_Kind.SYNC, SpeedClass.OTHER),
}
_PASS_CLASS = {"forward": SpeedClass.CONV_FORWARD, "input_grad": SpeedClass.CONV_INPUT_GRAD,
               "weight_grad": SpeedClass.CONV_WEIGHT_GRAD}  # fmt: skip


def speed_kind(op: object) -> tuple[_Kind, SpeedClass, str, bool]:
    """How ``op`` is priced, the class its time falls in, its name in the tables, and whether
    it is elementwise (dense reads and writes in either layout: priced alike in both): as the
    operator registry declares it, else from its tags."""
    name = aten_op_name(op)
    table_name = name.replace("aten.", "aten::", 1)
    declared = lookup(name)
    classes = declared.classes if declared is not None else frozenset()
    for cls, (kind, speed_class) in _PRICED.items():
        if cls in classes:
            return kind, speed_class, table_name, False
    pointwise, reduction, view, _ = op_traits(op)
    if view or OpClass.VIEW in classes:
        return _Kind.VIEW, SpeedClass.OTHER, table_name, False
    if declared is not None and declared.priced_like is not None:
        table_name = declared.priced_like
    if OpClass.NORMALISATION in classes:
        return _Kind.TABLE, SpeedClass.NORMALISATION, table_name, False
    bare = name.removeprefix("aten.")
    pointwise = pointwise or OpClass.POINTWISE in classes
    passes = pointwise or reduction or OpClass.CONCATENATION in classes
    if passes or "pool" in bare or "upsample" in bare:
        return _Kind.TABLE, SpeedClass.ELEMENTWISE, table_name, pointwise
    return _Kind.TABLE, SpeedClass.OTHER, table_name, False


def _eval_norm(name: str, outputs: list[torch.Tensor]) -> bool:
    """A batch norm in eval mode (running statistics: no statistics saved), which costs an
    elementwise pass where training computes the batch's statistics first."""
    if name.endswith("_no_training"):
        return True
    return "batch_norm" in name and len(outputs) >= 2 and outputs[1].numel() == 0


def _layout(tensor: torch.Tensor) -> str:
    """The layout a kernel reads a map in: channels_last, else NCHW (the tables' two)."""
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=_CL) and not tensor.is_contiguous():
        return "channels_last"
    return "nchw"


def _channels(tensor: torch.Tensor) -> int:
    dim = tensor.dim()
    return tensor.shape[1] if dim == 4 else (tensor.shape[-1] if dim else 1)


def _conv_call(data: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> ConvCall | None:
    """A 2-D convolution's sizes from its input, weight and output (groups from the weight;
    the stride from the sides); None for any other rank."""
    if data.dim() != 4 or weight.dim() != 4 or out.dim() != 4:
        return None
    n, cin, h, w = data.shape
    cout, per_group, k, _ = weight.shape
    groups = max(cin // max(per_group, 1), 1)
    stride = max(round(h / max(out.shape[2], 1)), 1)
    return ConvCall(n, cin, h, w, cout, groups, k, stride, out.shape[2], out.shape[3])


# What an operation is priced by (hashable: operations alike are priced once):
#   (TABLE, name, layout, elements, channels, class, dense, shape of the first input)
#   (CONV, ConvCall, layout, passes); (MATMUL, count, m, k, n, class); (COPY, elements,
#   converts, to another device); (VIEW,) and (SYNC,), each made once
Key = tuple
_VIEW_KEY, _SYNC_KEY = (_Kind.VIEW,), (_Kind.SYNC,)


@dataclass
class OpTimes:
    """What one run's operations need for their time to be predicted, in the order they ran
    (see the module docstring): each operation's key, and where each phase began (the index of
    its first key). Fed on every operation: one cached lookup and an append, the sizes read
    only where the kind needs them. With a ``cut`` (the page's picture), also the stage each
    operation ran in (``stage``, before it): where each stage's run of keys began."""

    keys: list[Key] = field(default_factory=list)
    phases: list[tuple[int, Phase]] = field(default_factory=list)
    cut: StageCut | None = None
    stages: list[tuple[int, str]] = field(default_factory=list)
    _kinds: dict[object, tuple[_Kind, SpeedClass, str, bool]] = field(default_factory=dict)
    _phase: Phase | None = None  # the phase of the last key
    _parts: dict[str | None, str] = field(default_factory=dict)  # module path -> its stage

    def stage(self, phase: Phase, module_path: Callable[[], str | None]) -> None:
        """The stage of the operation observed next (``StageCut.of``): its module's
        (``module_path()``, a stack walk, asked only outside the optimizer)."""
        assert self.cut is not None
        if phase is Phase.OPTIMIZER:
            name = self.cut.of(None, phase)
        else:
            path = module_path()
            name = self._parts.get(path) or self._parts.setdefault(path, self.cut.of(path))
        if not self.stages or self.stages[-1][1] != name:
            self.stages.append((len(self.keys), name))

    def observe(
        self,
        op: object,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        phase: Phase = Phase.FORWARD,
    ) -> None:
        known = self._kinds.get(op)
        if known is None:
            known = self._kinds[op] = speed_kind(op)
        key = self._key(known, inputs, outputs)
        if key is not None:
            if phase is not self._phase:
                self.phases.append((len(self.keys), phase))
                self._phase = phase
            self.keys.append(key)

    @property
    def events(self) -> Iterator[tuple[Key, Phase]]:
        """Each operation's key with its phase, in order."""
        ends = [start for start, _ in self.phases[1:]] + [len(self.keys)]
        for (start, phase), end in zip(self.phases, ends[: len(self.phases)], strict=True):
            for key in self.keys[start:end]:
                yield key, phase

    def _key(
        self,
        known: tuple[_Kind, SpeedClass, str, bool],
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
    ) -> Key | None:
        kind, cls, name, dense = known
        if kind is _Kind.TABLE:
            first = inputs[0] if inputs else (outputs[0] if outputs else None)
            if first is None:
                return None
            elements = sum(t.numel() for t in inputs) or first.numel()
            if cls is SpeedClass.NORMALISATION and _eval_norm(name, outputs):
                name += ":eval"
            shape = first.shape  # a torch.Size: a tuple already
            return (kind, name, _layout(first), elements, _channels(first), cls, dense, shape)
        if kind is _Kind.VIEW:
            return _VIEW_KEY
        if kind is _Kind.SYNC:
            return _SYNC_KEY
        if kind is _Kind.COPY:
            if not inputs or not outputs:
                return None
            source, copy = inputs[-1] if name == "aten::copy_" else inputs[0], outputs[0]
            away = source.is_cuda != copy.is_cuda  # to or from the host
            return (kind, copy.numel(), _layout(source) != _layout(copy), away)
        if kind is _Kind.CONV and len(inputs) >= 2 and outputs:
            call = _conv_call(inputs[0], inputs[1], outputs[0])
            return None if call is None else (kind, call, _layout(inputs[0]), ("forward",))
        if kind is _Kind.CONV_BACKWARD and len(inputs) >= 3:
            grad, data, weight = inputs[0], inputs[1], inputs[2]
            call = _conv_call(data, weight, grad)
            passes = tuple(
                p for p, shape in (("input_grad", data.shape), ("weight_grad", weight.shape))
                if any(o.shape == shape for o in outputs)
            )  # fmt: skip
            if call is None or not passes:
                return None
            return (_Kind.CONV, call, _layout(data), passes)
        if kind is _Kind.MATMUL:
            return _product(inputs, cls)
        if kind in (_Kind.ATTENTION, _Kind.ATTENTION_BACKWARD) and len(inputs) >= 3:
            q, k = inputs[0], inputs[1]
            if q.dim() == 4 and k.dim() == 4:
                heads, length, depth = q.shape[0] * q.shape[1], q.shape[2], q.shape[3]
                products = 5 if kind is _Kind.ATTENTION_BACKWARD else 2
                return (_Kind.MATMUL, products * heads, length, depth, k.shape[2], cls)
        return None

    def convolutions(self) -> set[tuple[ConvCall, str, tuple[str, ...]]]:
        """Each distinct convolution the run made: its sizes, layout and passes."""
        return {key[1:] for key in self.keys if key[0] is _Kind.CONV}

    def maps(self) -> Counter[tuple[str, tuple[int, ...]]]:
        """The operations priced from the table's samples, by name and input shape (calls)."""
        return Counter((key[1], tuple(key[7])) for key in self.keys if key[0] is _Kind.TABLE)


def _product(inputs: list[torch.Tensor], cls: SpeedClass) -> Key | None:
    """(MATMUL, count, m, k, n, class) of a matrix product: its last two inputs, operands."""
    if len(inputs) < 2:
        return None
    a, b = inputs[-2], inputs[-1]
    if a.dim() < 2 or b.dim() < 2:
        return None
    batch = a.shape[0] if a.dim() == 3 else 1
    return (_Kind.MATMUL, batch, a.shape[-2], a.shape[-1], b.shape[-1], cls)


@dataclass(frozen=True)
class StepTime:
    """A run's predicted step: its milliseconds (the queue's end), the device's busy time by
    class and in all, the host's own time, the kernels launched and the operations the table
    had no samples of (name -> calls); with the step's operations as the queue took them and
    each one's conversion microseconds, to replay it without them."""

    ms: float
    device_ms: float
    host_ms: float
    launches: int
    by_class: dict[SpeedClass, float]
    stand_ins: dict[str, int]
    issued: tuple[Issued, ...] = ()
    converting_us: tuple[float, ...] = ()
    asynchronous: bool = False
    by_stage: dict[str, float] = field(default_factory=dict)

    def replayed_without_conversions(self, fraction: float) -> float:
        """The step's milliseconds with ``fraction`` of every conversion's kernel time gone
        (what fixing the cost sites would leave)."""
        ops = (
            Issued(op.host_us, op.device_us - fraction * c, op.sync) if c else op
            for op, c in zip(self.issued, self.converting_us, strict=True)
        )
        return replay(ops, self.asynchronous).end_us / 1e3


def predict(
    times: OpTimes,
    table: SpeedTable,
    dtype: str,
    train: bool,
    converted_elements: int = 0,
    converted_stages: Mapping[str, float] | None = None,
) -> StepTime:
    """The step ``times`` recorded, priced by ``table`` for ``dtype`` (the run's compute
    dtype: autocast's, else the model's), a training step's or a forward's host costs, with
    ``converted_elements`` converted inside kernels (the ledger's; ``converted_stages``: each
    stage's share of them), replayed on the table's device (``predict.queue``). With the
    stages recorded, each stage's time is what its operations add to the step's end."""
    by_class: dict[SpeedClass, float] = defaultdict(float)
    stand_ins: Counter[str] = Counter()
    prices: dict[Key, _Price] = {}
    issued, converting = [], []
    for key, phase in times.events:
        price = prices.get(key)
        if price is None:
            price = prices[key] = _price(key, table, dtype)
        us, parts, missing = price
        conversion = 0.0
        for cls, part in parts:
            by_class[cls] += part / 1e3
            if cls is SpeedClass.CONVERSION:
                conversion += part
        for name in missing:
            stand_ins[name] += 1
        sync = key[0] is _Kind.SYNC or (key[0] is _Kind.COPY and key[3])
        issued.append(Issued(_host_us(table.host, key[0], phase, train), us, sync))
        converting.append(conversion)
    if converted_elements:  # inside the kernels that converted: device time, no launch
        us = table.op_us("copy:convert", "nchw", dtype, converted_elements, 1) or 0.0
        by_class[SpeedClass.CONVERSION] += us / 1e3
        issued.append(Issued(0.0, us))
        converting.append(us)
    ends: list[float] | None = [] if times.cut is not None else None
    timeline = replay(issued, table.asynchronous, ends)
    launches = sum(1 for op in issued if op.device_us > 0)
    by_stage = {} if ends is None else _stage_times(times, ends, converted_stages or {})
    return StepTime(
        timeline.end_us / 1e3,
        timeline.device_us / 1e3,
        timeline.host_us / 1e3,
        launches,
        dict(by_class),
        dict(stand_ins),
        tuple(issued),
        tuple(converting),
        table.asynchronous,
        by_stage,
    )


def _stage_times(
    times: OpTimes, ends: list[float], converted: Mapping[str, float]
) -> dict[str, float]:
    """Milliseconds by stage: what each stage's run of keys added to the step's end; the
    conversions inside kernels (the operation after the keys, if any) split by ``converted``."""
    by_stage: dict[str, float] = defaultdict(float)
    keys = len(times.keys)
    starts = [start for start, _ in times.stages]
    for (start, name), stop in zip(times.stages, [*starts[1:], keys], strict=True):
        if stop > start:
            by_stage[name] += (ends[stop - 1] - (ends[start - 1] if start else 0.0)) / 1e3
    if len(ends) > keys:
        lump, whole = (ends[-1] - (ends[keys - 1] if keys else 0.0)) / 1e3, sum(converted.values())
        for name, part in converted.items() if whole else ((ROOT, 1.0),):
            by_stage[name] += lump * part / (whole or 1.0)
    return dict(by_stage)


def _host_us(host: HostCosts, kind: _Kind, phase: Phase, train: bool) -> float:
    """The host's own microseconds for one operation of ``kind`` in ``phase``."""
    if kind is _Kind.VIEW:
        return host.view_grad if train and phase is not Phase.OPTIMIZER else host.view
    if kind is _Kind.SYNC:
        return host.sync
    if not train:
        return host.forward
    if phase is Phase.BACKWARD:
        return host.backward
    return host.optimizer if phase is Phase.OPTIMIZER else host.forward_grad


# An operation's price: its kernels' microseconds, their split by class, and the names of
# what the table had no samples of (each call counted)
_Price = tuple[float, tuple[tuple[SpeedClass, float], ...], tuple[str, ...]]


def _price(key: Key, table: SpeedTable, dtype: str) -> _Price:
    """What one operation's kernels cost (see the module docstring)."""
    kind = key[0]
    if kind is _Kind.TABLE:
        name, layout, elements, channels, cls, dense = key[1:7]
        us = table.op_us(name, layout, dtype, elements, channels, dense)
        if us is not None:
            return us, ((cls, us),), ()
        us = table.op_us("aten::add", layout, dtype, elements, channels, True) or table.floor_us
        return us, ((cls, us),), (name,)
    if kind is _Kind.CONV:
        call, layout, passes = key[1:]
        parts, missing = [], []
        for p in passes:
            ms = table.conv_ms(call, dtype, layout, p)
            if ms is None:
                missing.append(f"aten::convolution ({dtype})")
            else:
                parts.append((_PASS_CLASS[p], ms * 1e3))
        return sum(us for _, us in parts), tuple(parts), tuple(missing)
    if kind is _Kind.MATMUL:
        count, m, k, n, cls = key[1:]
        gemm = ConvCall(count * m, k, 1, 1, n, 1, 1, 1, 1, 1)
        ms = table.conv_ms(gemm, dtype, "channels_last", "forward")
        if ms is None:
            return 0.0, (), (f"matrix product ({dtype})",)
        return ms * 1e3, ((cls, ms * 1e3),), ()
    if kind is _Kind.COPY:
        elements, converts = key[1], key[2]
        op = "copy:convert" if converts else "copy:dense"
        us = table.op_us(op, "nchw", dtype, elements, 1) or table.floor_us
        return us, ((SpeedClass.CONVERSION if converts else SpeedClass.ELEMENTWISE, us),), ()
    return 0.0, (), ()  # views and synchronisations launch nothing the model prices
