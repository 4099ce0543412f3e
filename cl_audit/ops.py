"""The operator coverage index (``cl-audit ops``): what each operator returns for channels_last
input, from the sample inputs of torch's own operator database (``cl_audit.compat.opinfo``).

A sample counts when its first input is a 4-D or 5-D floating-point tensor. It runs twice: as
the database gives it (NCHW), then with every 4-D and 5-D floating-point tensor among its
arguments made channels_last (channels_last_3d), as a channels_last model hands them over (the
data and the convolution weights alike). A sample that fails in NCHW is not counted. The
channels_last call's first 4-D or 5-D output then says what the operator does
(``OpBehaviour``): it keeps channels_last, loses it (NCHW strides), returns other strides, only
follows its input (the NCHW call's output is not NCHW either: a view or a reordering), refuses
(raises), or the input or output is both orders at once: size-1 dimensions, or no elements
(ambiguous, naming which). An operator's behaviour is the worst of its samples', with that
sample as the example; every count is kept.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cl_audit.audit import watching
from cl_audit.compat import (
    fake_cuda_problem,
    fake_tensor,
    map_tensors,
    new_fake_mode,
    tensor_leaves,
)
from cl_audit.compat.opinfo import OperatorEntry, Sample
from cl_audit.enums import Engine, OpBehaviour
from cl_audit.errors import UsageError, first_line
from cl_audit.fake import KernelSourceMode
from cl_audit.intercept.naming import aten_op_name
from cl_audit.layout import MemoryLayout, layout_of
from cl_audit.report import SweepReport
from cl_audit.report.codec import decode, encode
from cl_audit.report.envelope import (
    OPS_FORMAT,
    OPS_READABLE,
    OPS_VERSION,
    read_envelope,
)

__all__ = [
    "OpChange",
    "OpCost",
    "OperatorRow",
    "OpsIndex",
    "SampleResult",
    "Target",
    "build_index",
    "diff",
    "operator_row",
    "probe_sample",
    "rank_costs",
    "select",
    "target_for",
]

_WORST = tuple(OpBehaviour)  # the enum's order: worst first


@dataclass(frozen=True)
class SampleResult:
    """One sample's behaviour, its input's and output's shape and strides in channels_last
    (the output None where it raised or returned no map), a note (which dimensions are
    ambiguous, or the error's first line), the aten operation that made the output, and what
    the backward hands the input for a channels_last gradient of that output (``gradient``:
    keeps, loses, other or ambiguous; None where nothing was differentiated: no real kernel,
    no gradient, or the backward failed)."""

    behaviour: OpBehaviour
    input_shape: tuple[int, ...]
    input_strides: tuple[int, ...]
    output_shape: tuple[int, ...] | None = None
    output_strides: tuple[int, ...] | None = None
    note: str | None = None
    producer: str | None = None  # the aten operation that made the output (``aten.convolution``)
    gradient: OpBehaviour | None = None  # the input gradient's, for a channels_last output's
    gradient_strides: tuple[int, ...] | None = None


@dataclass(frozen=True)
class OperatorRow:
    """An operator: its worst behaviour, how many samples behaved each way, and the example
    (the first sample of the worst behaviour); ``error`` when its samples could not be made."""

    op: str
    behaviour: OpBehaviour | None
    counts: tuple[tuple[OpBehaviour, int], ...]
    example: SampleResult | None
    error: str | None = None
    aten_ops: tuple[str, ...] = ()  # what made its samples' outputs: how sweeps' sites join it
    gradient: OpBehaviour | None = None  # the worst of its samples' input gradients
    gradient_counts: tuple[tuple[OpBehaviour, int], ...] = ()


@dataclass(frozen=True)
class OpsIndex:
    """The index of one torch release, device and dtype; ``without_map``: operators none of
    whose samples has a 4-D or 5-D floating-point first input (not listed); ``predicted``:
    run on fake tensors of a device this machine lacks (no kernel ran)."""

    torch: str
    device: str
    dtype: str
    rows: tuple[OperatorRow, ...]
    without_map: int
    seconds: float
    predicted: bool = False

    def count(self, behaviour: OpBehaviour) -> int:
        return sum(row.behaviour is behaviour for row in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"format": OPS_FORMAT, "version": OPS_VERSION, **encode(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpsIndex:
        return read_envelope(data, OPS_FORMAT, OPS_READABLE, lambda _: decode(cls, data))


def _is_map(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() in (4, 5) and value.is_floating_point()


def _channels_last(value: object) -> object:
    if not _is_map(value):
        return value
    assert isinstance(value, torch.Tensor)
    fmt = torch.channels_last if value.dim() == 4 else torch.channels_last_3d
    return value.contiguous(memory_format=fmt)


def _size_one(tensor: torch.Tensor) -> str:
    """Which dimensions make ``tensor`` both orders at once."""
    spatial = tensor.shape[2:]
    if tensor.shape[1] == 1:
        return "size-1 channels"
    if all(size == 1 for size in spatial):
        return "size-1 spatial dimensions"
    return "size-1 dimensions"


def _first_map(value: object) -> torch.Tensor | None:
    return next((t for t in tensor_leaves(value) if t.dim() in (4, 5)), None)


@dataclass(frozen=True)
class Target:
    """Where the samples run: ``place`` puts a CPU tensor there (with its strides), and every
    call runs inside ``context()`` (the fake mode and kernel-source overrides of a predicted
    device)."""

    device: str
    predicted: bool = False
    place: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext


CPU = Target("cpu")


def target_for(device: str) -> Target:
    """The CPU; a CUDA device (fake tensors with the kernel-source overrides, a prediction,
    where this machine has no GPU); ``UsageError`` where fake CUDA cannot predict honestly."""
    kind = torch.device(device).type
    if kind == "cpu":
        return CPU
    if kind != "cuda":
        raise UsageError(f"cl-audit ops runs on cpu or cuda, not {device}")
    if torch.cuda.is_available():
        return Target("cuda", place=lambda t: t.to("cuda"))
    problem = fake_cuda_problem()
    if problem is not None:
        raise UsageError(problem)
    mode = new_fake_mode()
    kernels = KernelSourceMode.for_device(torch.device("cuda"))

    @contextlib.contextmanager
    def fake_cuda() -> Iterator[None]:
        with mode, kernels:
            yield

    cuda = torch.device("cuda")
    return Target("cuda", True, lambda t: fake_tensor(mode, t, cuda), fake_cuda)


class _Producers:
    """An ``Observer``: the aten operation that made each tensor of a call, by identity."""

    def __init__(self) -> None:
        self.made: dict[int, str] = {}

    def observe(self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any):
        for tensor in tensor_leaves(result):
            self.made[id(tensor)] = aten_op_name(aten_op)


def _run(
    call: Callable[..., Any],
    target: Target,
    x: Any,
    args: Any,
    kwargs: Any,
    producers: _Producers | None = None,
) -> Any:
    """``call`` on ``target``; with ``producers``, under the dispatch engine that tells them
    which operation made each tensor."""
    x, args, kwargs = map_tensors(target.place, (x, args, kwargs))
    with target.context():
        if producers is None:
            return call(x, *args, **kwargs)
        with watching(Engine.DISPATCH, producers):
            return call(x, *args, **kwargs)


def probe_sample(
    call: Callable[..., Any], sample: Sample, target: Target = CPU
) -> SampleResult | None:
    """What ``call`` returns on ``target`` for ``sample`` made channels_last; None when the
    sample does not count (its first input is no map, or it fails in NCHW)."""
    if not _is_map(sample.input):
        return None
    try:
        reference = _run(call, target, sample.input, sample.args, sample.kwargs)
    except Exception:  # the sample is not valid here: not counted, whatever channels_last does
        return None
    x = _channels_last(sample.input)
    assert isinstance(x, torch.Tensor)
    seen = {"input_shape": tuple(x.shape), "input_strides": x.stride()}
    if x.numel() == 0:
        return SampleResult(OpBehaviour.AMBIGUOUS, **seen, note="input: no elements")
    if layout_of(x) is MemoryLayout.AMBIGUOUS:
        return SampleResult(OpBehaviour.AMBIGUOUS, **seen, note=f"input: {_size_one(x)}")
    args = tuple(_channels_last(a) for a in sample.args)
    kwargs = {k: _channels_last(v) for k, v in sample.kwargs.items()}
    try:
        producers = _Producers()
        result = _run(call, target, x, args, kwargs, producers)
    except Exception as e:
        return SampleResult(OpBehaviour.REFUSES, **seen, note=first_line(e)[:200])
    out, ref = _first_map(result), _first_map(reference)
    if out is None or ref is None:
        return SampleResult(OpBehaviour.NO_MAP, **seen)
    seen |= {
        "output_shape": tuple(out.shape),
        "output_strides": out.stride(),
        "producer": producers.made.get(id(out)),
    }
    if not target.predicted:  # autograd's engine runs real kernels only
        seen |= _gradient(call, *map_tensors(target.place, (x, args, kwargs)))
    layout = layout_of(out)
    if layout is MemoryLayout.AMBIGUOUS:
        return SampleResult(OpBehaviour.AMBIGUOUS, **seen, note=f"output: {_size_one(out)}")
    if layout is MemoryLayout.CHANNELS_LAST:
        return SampleResult(OpBehaviour.KEEPS, **seen)
    if layout_of(ref) not in (MemoryLayout.CONTIGUOUS, MemoryLayout.AMBIGUOUS):
        return SampleResult(OpBehaviour.FOLLOWS, **seen)
    if layout is MemoryLayout.CONTIGUOUS:
        return SampleResult(OpBehaviour.LOSES, **seen)
    return SampleResult(OpBehaviour.OTHER, **seen)


def _gradient(call: Callable[..., Any], x: torch.Tensor, args: Any, kwargs: Any) -> dict:
    """The input gradient's behaviour and strides for a channels_last gradient of the
    output, as a channels_last model's backward hands it over; nothing where none flows."""
    leaf = x.detach().requires_grad_(True)
    try:
        with torch.enable_grad():
            out = _first_map(call(leaf, *args, **kwargs))
            if out is None or not out.requires_grad:
                return {}
            grad_out = _channels_last(torch.ones_like(out, memory_format=torch.contiguous_format))
            (grad,) = torch.autograd.grad(out, leaf, grad_out, allow_unused=True)
    except Exception:  # no backward for these arguments: the gradient is not judged
        return {}
    if grad is None:
        return {}
    layout = layout_of(grad)
    behaviour = {
        MemoryLayout.CHANNELS_LAST: OpBehaviour.KEEPS,
        MemoryLayout.CONTIGUOUS: OpBehaviour.LOSES,
        MemoryLayout.AMBIGUOUS: OpBehaviour.AMBIGUOUS,
    }.get(layout, OpBehaviour.OTHER)
    return {"gradient": behaviour, "gradient_strides": grad.stride()}


def operator_row(entry: OperatorEntry, target: Target = CPU) -> OperatorRow | None:
    """``entry``'s row on ``target``, or None when none of its samples counts."""
    results: list[SampleResult] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecations of the database's own calls
            for sample in entry.samples():
                found = probe_sample(entry.call, sample, target)
                if found is not None:
                    results.append(found)
    except Exception as e:  # making a sample failed: a row with its error, never a crash
        return OperatorRow(entry.name, None, (), None, first_line(e)[:200])
    if not results:
        return None
    counts = Counter(r.behaviour for r in results)
    worst = next(b for b in _WORST if counts[b])
    example = next(r for r in results if r.behaviour is worst)
    ordered = tuple((b, counts[b]) for b in _WORST if counts[b])
    made = tuple(sorted({r.producer for r in results if r.producer is not None}))
    graded = Counter(r.gradient for r in results if r.gradient is not None)
    return OperatorRow(
        entry.name,
        worst,
        ordered,
        example,
        aten_ops=made,
        gradient=next((b for b in _WORST if graded[b]), None),
        gradient_counts=tuple((b, graded[b]) for b in _WORST if graded[b]),
    )


def build_index(entries: Iterable[OperatorEntry], target: Target, dtype: torch.dtype) -> OpsIndex:
    """Every operator's row on ``target``, the random samples seeded (0) for a repeatable
    index (made on the CPU, then placed)."""
    start = time.perf_counter()
    torch.manual_seed(0)
    rows: list[OperatorRow] = []
    without = 0
    for entry in entries:
        row = operator_row(entry, target)
        if row is None:
            without += 1
        else:
            rows.append(row)
    name = str(dtype).removeprefix("torch.")
    seconds = time.perf_counter() - start
    return OpsIndex(
        torch.__version__, target.device, name, tuple(rows), without, seconds, target.predicted
    )


def select(
    index: OpsIndex, patterns: tuple[str, ...] = (), behaviours: tuple[OpBehaviour, ...] = ()
) -> tuple[OperatorRow, ...]:
    """The rows whose operator matches one of ``patterns`` (globs; all when none) and whose
    behaviour is one of ``behaviours`` (all when none)."""
    return tuple(
        row
        for row in index.rows
        if (not patterns or any(fnmatch.fnmatchcase(row.op, p) for p in patterns))
        and (not behaviours or row.behaviour in behaviours)
    )


@dataclass(frozen=True)
class OpChange:
    """An operator whose behaviour differs between two indexes (None: absent from that index,
    or its samples could not be made there)."""

    op: str
    old: OpBehaviour | None
    new: OpBehaviour | None

    @property
    def better(self) -> bool | None:
        """True when the new behaviour is less bad (``OpBehaviour``'s order), False when worse,
        None when the operator is in one index only."""
        if self.old is None or self.new is None:
            return None
        return _WORST.index(self.new) > _WORST.index(self.old)


def diff(old: OpsIndex, new: OpsIndex) -> tuple[OpChange, ...]:
    """The operators whose behaviour differs from ``old`` to ``new`` (what a torch release
    fixed or broke), by name."""
    before = {row.op: row.behaviour for row in old.rows}
    after = {row.op: row.behaviour for row in new.rows}
    return tuple(
        OpChange(op, before.get(op), after.get(op))
        for op in sorted(before.keys() | after.keys())
        if before.get(op) != after.get(op)
    )


@dataclass(frozen=True)
class OpCost:
    """An operation that lost channels_last across a registry: the Python and aten operation
    that wrote the NCHW data a cost site converts (its fix site, else the site's own), how many
    models it costs and the channels_last-only bytes, and the index's rows for it."""

    python_op: str | None
    aten_op: str | None
    models: int
    bytes: int
    rows: tuple[OperatorRow, ...]


_PREFIXES = ("Tensor.", "torch.", "F.", "nn.functional.")


def _bare(python_op: str) -> str:
    for prefix in _PREFIXES:
        if python_op.startswith(prefix):
            return python_op[len(prefix) :]
    return python_op


def _rows_for(index: OpsIndex, python_op: str | None, aten_op: str | None) -> tuple:
    """The index's rows for an operation: by name (``F.interpolate`` is
    ``nn.functional.interpolate`` and its variants; those whose samples' outputs the same aten
    operation made, where some are); by the aten operation alone only for a site without a
    Python name."""
    if python_op is not None:
        bare = _bare(python_op)
        named = tuple(
            row
            for row in index.rows
            if _bare(row.op) == bare or _bare(row.op).startswith(bare + ".")
        )
        exact = tuple(row for row in named if aten_op in row.aten_ops)
        return exact or named
    if aten_op is None:
        return ()
    return tuple(row for row in index.rows if aten_op in row.aten_ops)


def rank_costs(index: OpsIndex, sweeps: Iterable[SweepReport]) -> tuple[OpCost, ...]:
    """The operations whose losses cost the sweeps' models most, costliest first: each cost
    site with channels_last-only bytes is charged to the operation that wrote its NCHW data."""
    models: dict[tuple[str | None, str | None], set[str]] = {}
    spent: Counter[tuple[str | None, str | None]] = Counter()
    for sweep in sweeps:
        for row in sweep.models:
            for site in row.cost.sites if row.cost is not None else ():
                if site.extra <= 0:
                    continue
                fix = site.fix_site
                key = (fix.python_op, fix.aten_op) if fix else (site.op, site.aten_op)
                models.setdefault(key, set()).add(row.key)
                spent[key] += site.extra
    return tuple(
        OpCost(python_op, aten_op, len(models[key]), spent[key], _rows_for(index, *key))
        for key, _ in spent.most_common()
        for python_op, aten_op in (key,)
    )
