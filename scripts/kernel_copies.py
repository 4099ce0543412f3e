"""Measure the copies kernels make inside of a strided input, per torch version and device, into
``cl_audit/predict/kernel_copies.json``: fake runs, which run no kernel, predict them from it
(``cl_audit.predict.divergences.kernel_copy_table``).

    python scripts/kernel_copies.py [--device cuda]

Each probe (a call a model makes on tokens, matrices or attention maps) runs with its inputs
contiguous, then with one floating-point input at a time restrided to each ``StrideClass``
(same shape, same values), under the profiler, each aten operation in a range of its own. An
operation handed exactly one non-contiguous floating-point input is measured: the bytes of the
``aten::copy_`` events inside it, less those of the contiguous run, as a fraction of that
input's bytes. A key (operation, input position, rank, stride class) enters the table when
that fraction is above zero; the fractions measured for one key must agree. Explicit copies
(``clone``, ``_to_copy``) are left out (the cost ledger counts them whatever the device), and
so are channels_last and contiguous maps at rank 4 and 5 (the ledger predicts those from the
order of the output). The table of this torch version and device is replaced; others are kept.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cl_audit.compat.operators import aten_op_name
from cl_audit.execution.timing import Profiler, copies_by_call
from cl_audit.intercept.dispatch import DispatchEngine
from cl_audit.intercept.tracking import nbytes, tensor_arguments
from cl_audit.registry import OpClass, names_in
from cl_audit.rule.layout import MemoryLayout, StrideClass, layout_of, stride_class

OUT = Path(__file__).resolve().parents[1] / "cl_audit" / "predict" / "kernel_copies.json"

Probe = tuple[str, Callable[..., Any], tuple[tuple[int, ...], ...], tuple[int, ...]]

# (name, call, input shapes, the inputs restrided): the calls that models make on data that
# channels_last leaves strided (flattened or permuted maps, split channels, attention maps);
# weights and statistics stay contiguous, as a model's parameters are
PROBES: tuple[Probe, ...] = (
    ("softmax", lambda x: x.softmax(-1), ((2, 16, 24),), (0,)),
    ("softmax 2-D", lambda x: x.softmax(-1), ((16, 24),), (0,)),
    ("softmax 4-D", lambda x: x.softmax(-1), ((2, 3, 16, 24),), (0,)),
    ("log_softmax", lambda x: x.log_softmax(-1), ((2, 16, 24),), (0,)),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (24,), w, b), ((2, 16, 24), (24,), (24,)), (0,)),
    (
        "layer_norm 4-D",
        lambda x, w, b: F.layer_norm(x, (24,), w, b),
        ((2, 3, 16, 24), (24,), (24,)),
        (0,),
    ),
    ("group_norm", lambda x, w, b: F.group_norm(x, 4, w, b), ((2, 16, 24), (16,), (16,)), (0,)),
    (
        "batch_norm",
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b),
        ((2, 16, 24), (16,), (16,), (16,), (16,)),
        (0,),
    ),
    ("linear", lambda x, w, b: F.linear(x, w, b), ((16, 24), (8, 24), (8,)), (0,)),
    ("linear no bias", lambda x, w: F.linear(x, w), ((16, 24), (8, 24)), (0,)),
    ("bmm", lambda a, b: torch.bmm(a, b), ((2, 16, 24), (2, 24, 8)), (0, 1)),
    (
        "baddbmm",
        lambda c, a, b: torch.baddbmm(c, a, b),
        ((2, 16, 8), (2, 16, 24), (2, 24, 8)),
        (0, 1, 2),
    ),
    ("conv1d", lambda x, w, b: F.conv1d(x, w, b), ((2, 16, 24), (8, 16, 1), (8,)), (0,)),
    (
        "conv1d depthwise",
        lambda x, w: F.conv1d(x, w, padding=1, groups=16),
        ((2, 16, 24), (16, 1, 3)),
        (0,),
    ),
    ("avg_pool1d", lambda x: F.avg_pool1d(x, 2), ((2, 16, 24),), (0,)),
    ("max_pool1d", lambda x: F.max_pool1d(x, 2), ((2, 16, 24),), (0,)),
    ("cumsum", lambda x: x.cumsum(-1), ((2, 16, 24),), (0,)),
    (
        "scaled_dot_product_attention",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        ((2, 3, 16, 8), (2, 3, 16, 8), (2, 3, 16, 8)),
        (0, 1, 2),
    ),
    # maps in neither order (a permuted 4-D position embedding, tokens folded back)
    (
        "interpolate bilinear",
        lambda x: F.interpolate(x, size=(12, 20), mode="bilinear"),
        ((2, 8, 6, 10),),
        (0,),
    ),
    (
        "interpolate bicubic",
        lambda x: F.interpolate(x, size=(12, 20), mode="bicubic"),
        ((2, 8, 6, 10),),
        (0,),
    ),
    (
        "interpolate nearest",
        lambda x: F.interpolate(x, size=(12, 20), mode="nearest"),
        ((2, 8, 6, 10),),
        (0,),
    ),
    ("conv2d", lambda x, w: F.conv2d(x, w, padding=1), ((2, 8, 6, 10), (4, 8, 3, 3)), (0,)),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 2), ((2, 8, 6, 10),), (0,)),
    ("max_pool2d", lambda x: F.max_pool2d(x, 2), ((2, 8, 6, 10),), (0,)),
    ("batch_norm 4-D", lambda x, m, v: F.batch_norm(x, m, v), ((2, 8, 6, 10), (8,), (8,)), (0,)),
    ("group_norm 4-D", lambda x: F.group_norm(x, 2), ((2, 8, 6, 10),), (0,)),
)


def _restrided(tensor: torch.Tensor, wanted: StrideClass) -> torch.Tensor | None:
    """``tensor``'s values in a layout of class ``wanted`` (None where its rank has none): a
    storage order (slowest dim first) for the dense classes; for the sparse ones its fastest dim
    padded."""
    rank = tensor.dim()
    dims = list(range(rank))
    inner = wanted.value.split("-")[1]
    if inner == "last":
        order = [1, 0, *dims[2:]] if wanted is StrideClass.DENSE_LAST else dims
    elif inner == "second":
        order = [*dims[:-2], rank - 1, rank - 2]
    else:
        order = [*dims[1:], 0]
    if (
        rank < 2
        or (wanted is StrideClass.DENSE_LAST and rank < 3)
        or (order == dims and (wanted.value.startswith("dense")))
    ):
        return None
    sizes = [tensor.shape[d] for d in order]
    if wanted.value.startswith("sparse"):
        sizes[-1] *= 2
    base = torch.empty(sizes, dtype=tensor.dtype, device=tensor.device)
    if wanted.value.startswith("sparse"):
        base = base.narrow(rank - 1, 0, tensor.shape[order[-1]])
    result = base.permute([order.index(d) for d in dims])
    result.copy_(tensor)
    if stride_class(result) is not wanted:
        return None
    if rank in (4, 5) and layout_of(result) is not MemoryLayout.OTHER:
        return None  # an ordered map: the ledger predicts from the output's order
    return result


class _Calls:
    """An ``Observer``: each aten call's operation and tensor inputs, in the order the dispatch
    engine numbers (and labels) them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[torch.Tensor]]] = []

    def observe(self, aten_op: Any, python_op: Any, args: Any, kwargs: Any, result: Any) -> None:
        inputs = tensor_arguments(args) + tensor_arguments((kwargs or {}).values())
        self.calls.append((aten_op_name(aten_op), inputs))


def _run(call: Callable[..., Any], inputs: list[torch.Tensor], device: torch.device) -> list:
    """(op, its inputs, bytes copied inside it) for each aten call of one probe run."""
    call(*inputs)  # warm up (first-call allocations, lazy initialisation)
    seen = _Calls()
    engine = DispatchEngine(seen, label_calls=True)
    with Profiler(device, shapes=True) as profiler:
        engine.install()
        try:
            call(*inputs)
        finally:
            engine.uninstall()
    copies, _ = copies_by_call(profiler)
    measured = []
    for number, (op, op_inputs) in enumerate(seen.calls, start=1):
        size = next((t.element_size() for t in op_inputs if t.is_floating_point()), 4)
        copied = sum(numel * (element or size) for numel, element in copies.get(number, ()))
        measured.append((op, op_inputs, copied))
    return measured


def _probe(probe: Probe, device: torch.device) -> dict[tuple[str, int, int, str], set[float]]:
    name, call, shapes, restrided = probe
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=generator).to(device) for s in shapes]
    baseline: dict[str, int] = {}
    for op, _, copied in _run(call, inputs, device):
        baseline[op] = baseline.get(op, 0) + copied
    found: dict[tuple[str, int, int, str], set[float]] = {}
    for position in restrided:
        tensor = inputs[position]
        for wanted in StrideClass:
            strided = _restrided(tensor, wanted)
            if strided is None:
                continue
            trial = [strided if i == position else t for i, t in enumerate(inputs)]
            for op, op_inputs, copied in _run(call, trial, device):
                odd = [
                    (i, t) for i, t in enumerate(op_inputs)
                    if t.is_floating_point() and not t.is_contiguous()
                ]  # fmt: skip
                if op in names_in(OpClass.COPY) or len(odd) != 1:
                    continue
                index, read = odd[0]
                if read.dim() in (4, 5) and layout_of(read) is not MemoryLayout.OTHER:
                    continue  # an ordered map: predicted from the output's order
                extra = max(copied - baseline.get(op, 0), 0)
                key = (op, index, read.dim(), stride_class(read).value)
                found.setdefault(key, set()).add(round(extra / nbytes([read]), 2))
    print(f"  {name}: measured")
    return found


def table(device: torch.device) -> dict:
    torch.set_num_threads(1)  # copies, not speed: one thread, as the audits' workers run
    measured: dict[tuple[str, int, int, str], set[float]] = {}
    for probe in PROBES:
        for key, fractions in _probe(probe, device).items():
            measured.setdefault(key, set()).update(fractions)
    disagree = {k: f for k, f in measured.items() if len(f) > 1}
    if disagree:
        raise SystemExit(f"fractions that disagree between probes: {disagree}")
    copies = [
        {"op": op, "input": index, "rank": rank, "strides": cls, "copied": fraction}
        for (op, index, rank, cls), (fraction,) in sorted(measured.items())
        if fraction > 0
    ]
    version = re.match(r"\d+\.\d+", torch.__version__)[0]
    return {
        "torch": version,
        "device": device.type,
        "measured": f"torch {torch.__version__}, {len(PROBES)} probes, {len(measured)} "
        f"(op, input, rank, strides) measured, {len(copies)} copy",
        "copies": copies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    new = table(torch.device(args.device))
    tables = []
    if args.out.exists():
        document = json.loads(args.out.read_text())
        tables = [
            t for t in document["tables"]
            if (t["torch"], t["device"]) != (new["torch"], new["device"])
        ]  # fmt: skip
    tables.append(new)
    tables.sort(key=lambda t: (t["device"], tuple(map(int, t["torch"].split(".")))))
    document = {"format": "cl-audit.kernel-copies", "version": 1, "tables": tables}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"torch {new['torch']} {new['device']}: {new['measured']}")
    for entry in new["copies"]:
        print(f"  {entry}")


if __name__ == "__main__":
    main()
