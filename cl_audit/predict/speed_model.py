"""The time a run's operations take on a device, predicted from its speed table: the per-operation
model behind a predicted speed verdict.

The cost ledger hands every operation of a run to an ``OpTimes`` (``observe``), which keeps
what the model needs and nothing else: each operation's name, its input's elements, channels
and layout; each convolution's shape and passes; each matrix product's and attention's size.
``predict`` then prices them with a ``SpeedTable``:

- a convolution (forward, input gradient, weight gradient) from the table's grid, by its kind,
  kernel, stride and work, in the layout its input ran in;
- a matrix product as the 1x1 channels_last convolution of the same sizes (the same GEMM);
  attention as its products (four per query, key and value head forward, ten backward);
- a copy at the dense or the converting copy's rate, by whether it changes the layout; the
  conversions inside kernels (the ledger's) at the converting copy's rate;
- every other operation from the table's samples of its own name and layout, scaled by its
  elements; an operation the table never measured at the elementwise ``aten::add``'s rate,
  counted in ``StepTime.stand_ins`` (and reported) rather than silently.

Each operation also costs the host something beyond its kernel (dispatch, autograd's record
and its backward, Python around it), per operation of a forward or of a training step as the
table says. A step is the host's time plus the share of the kernels' time it waits for
(``overlap``): all of it on the CPU, where nothing runs ahead; on CUDA the host queues kernels
while the device runs them, and the table says how much of the device's time a step still
waits for (fitted to measured steps: ``scripts/validate_speed.py --calibrate``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import Enum

import torch

from cl_audit.compat.operators import aten_op_name, op_traits
from cl_audit.enums import SpeedClass
from cl_audit.predict.speed_table import ConvCall, SpeedTable

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
    TABLE = "table"  # from the table's samples of its name


_CONVS = {"aten.convolution": _Kind.CONV, "aten.convolution_backward": _Kind.CONV_BACKWARD}
_MATMULS = frozenset(["aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm",
                      "aten._addmm_activation"])  # fmt: skip
_ATTENTION = frozenset(
    ["aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_flash_attention",
     "aten._scaled_dot_product_cudnn_attention", "aten._flash_attention_forward",
     "aten._scaled_dot_product_flash_attention_for_cpu", "aten._efficient_attention_forward"]
)  # fmt: skip
_COPIES = frozenset(["aten.clone", "aten.copy_", "aten._to_copy", "aten.copy", "aten.contiguous"])
_NORMS = frozenset(
    ["native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
     "_native_batch_norm_legit_functional", "cudnn_batch_norm", "miopen_batch_norm",
     "_batch_norm_with_update", "native_group_norm", "native_layer_norm",
     "native_batch_norm_backward", "cudnn_batch_norm_backward", "batch_norm_backward",
     "miopen_batch_norm_backward", "native_group_norm_backward", "native_layer_norm_backward",
     "_fused_rms_norm", "_fused_rms_norm_backward"]
)  # fmt: skip


def speed_kind(op: object) -> tuple[_Kind, SpeedClass, str, bool]:
    """How ``op`` is priced, the class its time falls in, its name in the tables, and whether
    it is elementwise (dense reads and writes in either layout: priced alike in both)."""
    name = aten_op_name(op)
    table_name = name.replace("aten.", "aten::", 1)
    if name in _CONVS:
        return _CONVS[name], SpeedClass.CONV_FORWARD, table_name, False
    if name in _MATMULS:
        return _Kind.MATMUL, SpeedClass.OTHER, table_name, False
    if name in _ATTENTION or name.removesuffix("_backward") in _ATTENTION:
        backward = name.endswith("_backward")
        kind = _Kind.ATTENTION_BACKWARD if backward else _Kind.ATTENTION
        return kind, SpeedClass.ATTENTION, table_name, False
    if name in _COPIES:
        return _Kind.COPY, SpeedClass.ELEMENTWISE, table_name, False
    pointwise, reduction, view, _ = op_traits(op)
    if view:
        return _Kind.VIEW, SpeedClass.OTHER, table_name, False
    bare = name.removeprefix("aten.")
    if bare in _NORMS:
        return _Kind.TABLE, SpeedClass.NORMALISATION, table_name, False
    if pointwise or reduction or "pool" in bare or "upsample" in bare or bare in ("cat", "stack"):
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


@dataclass
class OpTimes:
    """What one run's operations need for their time to be predicted (see the module
    docstring). Fed on every operation: one cached lookup and a list append per operation,
    the sizes read only where the kind needs them."""

    ops: list[tuple[str, str, int, int, SpeedClass, bool]] = field(default_factory=list)
    convs: list[tuple[ConvCall, str, tuple[str, ...]]] = field(default_factory=list)
    products: list[tuple[float, int, int, int, SpeedClass]] = field(default_factory=list)
    copies: list[tuple[int, bool]] = field(default_factory=list)  # (elements, converts)
    views: int = 0
    _kinds: dict[object, tuple[_Kind, SpeedClass, str, bool]] = field(default_factory=dict)

    def observe(self, op: object, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        known = self._kinds.get(op)
        if known is None:
            known = self._kinds[op] = speed_kind(op)
        kind, cls, name, dense = known
        if kind is _Kind.TABLE:
            first = inputs[0] if inputs else (outputs[0] if outputs else None)
            if first is not None:
                elements = sum(t.numel() for t in inputs) or first.numel()
                if cls is SpeedClass.NORMALISATION and _eval_norm(name, outputs):
                    name += ":eval"
                self.ops.append((name, _layout(first), elements, _channels(first), cls, dense))
        elif kind is _Kind.VIEW:
            self.views += 1
        elif kind is _Kind.COPY:
            if inputs and outputs:
                source, copy = inputs[-1] if name == "aten::copy_" else inputs[0], outputs[0]
                self.copies.append((copy.numel(), _layout(source) != _layout(copy)))
        elif kind is _Kind.CONV and len(inputs) >= 2 and outputs:
            call = _conv_call(inputs[0], inputs[1], outputs[0])
            if call is not None:
                self.convs.append((call, _layout(inputs[0]), ("forward",)))
        elif kind is _Kind.CONV_BACKWARD and len(inputs) >= 3:
            grad, data, weight = inputs[0], inputs[1], inputs[2]
            call = _conv_call(data, weight, grad)
            passes = tuple(
                p for p, shape in (("input_grad", data.shape), ("weight_grad", weight.shape))
                if any(o.shape == shape for o in outputs)
            )  # fmt: skip
            if call is not None and passes:
                self.convs.append((call, _layout(data), passes))
        elif kind is _Kind.MATMUL:
            self._product(name, inputs, cls)
        elif kind in (_Kind.ATTENTION, _Kind.ATTENTION_BACKWARD) and len(inputs) >= 3:
            q, k = inputs[0], inputs[1]
            if q.dim() == 4 and k.dim() == 4:
                heads, length, depth = q.shape[0] * q.shape[1], q.shape[2], q.shape[3]
                products = 5 if kind is _Kind.ATTENTION_BACKWARD else 2
                self.products.append((products * heads, length, depth, k.shape[2], cls))

    def _product(self, name: str, inputs: list[torch.Tensor], cls: SpeedClass) -> None:
        """(count, m, k, n) of a matrix product: the last two inputs are its operands."""
        if len(inputs) < 2:
            return
        a, b = inputs[-2], inputs[-1]
        if a.dim() < 2 or b.dim() < 2:
            return
        batch = a.shape[0] if a.dim() == 3 else 1
        self.products.append((batch, a.shape[-2], a.shape[-1], b.shape[-1], cls))


@dataclass(frozen=True)
class StepTime:
    """A run's predicted step: milliseconds by class, the device's and the host's totals, and
    the operations the table had no samples of (name -> calls)."""

    ms: float
    device_ms: float
    host_ms: float
    launches: int  # operations that run a kernel (views run none)
    by_class: dict[SpeedClass, float]
    stand_ins: dict[str, int]


def predict(
    times: OpTimes, table: SpeedTable, dtype: str, train: bool, converted_elements: int = 0
) -> StepTime:
    """The step ``times`` recorded, priced by ``table`` for ``dtype`` (the run's compute
    dtype: autocast's, else the model's), a training step's or a forward's host costs, with
    ``converted_elements`` converted inside kernels (the ledger's)."""
    by_class: dict[SpeedClass, float] = defaultdict(float)
    stand_ins: Counter[str] = Counter()
    for (name, layout, elements, channels, cls, dense), calls in Counter(times.ops).items():
        us = table.op_us(name, layout, dtype, elements, channels, dense)
        if us is None:
            stand_ins[name] += calls
            us = table.op_us("aten::add", layout, dtype, elements, channels, True) or table.floor_us
        by_class[cls] += calls * us / 1e3  # calls alike priced once (op-heavy loops repeat them)
    pass_class = {"forward": SpeedClass.CONV_FORWARD, "input_grad": SpeedClass.CONV_INPUT_GRAD,
                  "weight_grad": SpeedClass.CONV_WEIGHT_GRAD}  # fmt: skip
    for call, layout, passes in times.convs:
        for p in passes:
            ms = table.conv_ms(call, dtype, layout, p)
            if ms is None:
                stand_ins[f"aten::convolution ({dtype})"] += 1
                continue
            by_class[pass_class[p]] += ms
    for count, m, k, n, cls in times.products:
        gemm = ConvCall(count * m, k, 1, 1, n, 1, 1, 1, 1, 1)
        ms = table.conv_ms(gemm, dtype, "channels_last", "forward")
        if ms is None:
            stand_ins[f"matrix product ({dtype})"] += 1
            continue
        by_class[cls] += ms
    for elements, converts in times.copies:
        op = "copy:convert" if converts else "copy:dense"
        us = table.op_us(op, "nchw", dtype, elements, 1) or table.floor_us
        by_class[SpeedClass.CONVERSION if converts else SpeedClass.ELEMENTWISE] += us / 1e3
    if converted_elements:
        us = table.op_us("copy:convert", "nchw", dtype, converted_elements, 1)
        by_class[SpeedClass.CONVERSION] += (us or 0.0) / 1e3
    device = sum(by_class.values())
    launches = len(times.ops) + sum(len(p) for _, _, p in times.convs) + len(times.products)
    launches += len(times.copies)
    host = launches * table.host_us[train] / 1e3
    total = host + table.overlap * device
    return StepTime(total, device, host, launches, dict(by_class), dict(stand_ins))
