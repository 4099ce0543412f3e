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
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.profiler import record_function

from cl_audit.compat.backward import backward_problem, run_backward
from cl_audit.compat.cuda import cuda_present, fake_cuda_problem
from cl_audit.compat.failures import is_device_runtime_error
from cl_audit.compat.fake_mode import fake_tensor, new_fake_mode
from cl_audit.compat.operators import aten_op_name
from cl_audit.compat.opinfo import OperatorEntry, Sample
from cl_audit.compat.pytree import map_tensors, tensor_leaves
from cl_audit.enums import Engine, OpBehaviour
from cl_audit.errors import UsageError, first_line
from cl_audit.execution.audit_context import watching
from cl_audit.execution.timing import Profiler, copies_by_call
from cl_audit.intercept.dispatch import CALL_LABEL
from cl_audit.predict.fake_tensors import KernelSourceMode
from cl_audit.report import ModelReport, SweepReport
from cl_audit.report.codec import decode, encode
from cl_audit.report.envelope import (
    OPS_FORMAT,
    OPS_READABLE,
    OPS_VERSION,
    read_envelope,
)
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = [
    "OpChange",
    "OpCost",
    "OpLink",
    "OperatorRow",
    "OpsIndex",
    "SampleResult",
    "Target",
    "build_index",
    "diff",
    "operator_row",
    "probe_sample",
    "rank_costs",
    "report_links",
    "select",
    "target_for",
    "with_copies",
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
    copied: int | None = None  # bytes its kernel copied beyond the NCHW call's (real kernels)


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
    run on fake tensors of a device this machine lacks (no kernel ran);
    ``gradients_not_judged``: why no row has a gradient, when none was judged."""

    torch: str
    device: str
    dtype: str
    rows: tuple[OperatorRow, ...]
    without_map: int
    seconds: float
    predicted: bool = False
    gradients_not_judged: str | None = None

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
    """A 4-D or 5-D tensor (of any dtype: pooling's indices too) made channels_last."""
    if not isinstance(value, torch.Tensor) or value.dim() not in (4, 5):
        return value
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


def _first(value: object) -> torch.Tensor | None:
    return next(iter(tensor_leaves(value)), None)


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
    if cuda_present():
        return Target("cuda", place=lambda t: t.to("cuda"))
    problem = fake_cuda_problem(runtime=False)  # a call reaching the runtime: its row's error
    if problem is not None:
        raise UsageError(problem)
    mode = new_fake_mode()
    kernels = KernelSourceMode.for_device(torch.device("cuda"))

    @contextlib.contextmanager
    def fake_cuda() -> Iterator[None]:
        with mode, kernels.over(mode):
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
    label: int | None,
    producers: _Producers | None = None,
) -> Any:
    """``call`` on ``target``, in the profiler range ``label`` (where one is given); with
    ``producers``, under the dispatch engine that tells them which operation made each
    tensor."""
    x, args, kwargs = map_tensors(target.place, (x, args, kwargs))
    ranged = contextlib.nullcontext() if label is None else record_function(f"{CALL_LABEL}{label}")
    with target.context(), ranged:
        if producers is None:
            return call(x, *args, **kwargs)
        with watching(Engine.DISPATCH, producers):
            return call(x, *args, **kwargs)


def _unpredicted(target: Target, error: Exception) -> None:
    """Raise where fake tensors reached the device's runtime (torch 2.9 and earlier do for some
    operations): no prediction, neither an invalid sample nor a refusal."""
    if target.predicted and is_device_runtime_error(error):
        raise RuntimeError(
            f"fake {target.device} tensors reach the {target.device} runtime here on torch "
            f"{torch.__version__}: no prediction ({first_line(error)})"
        ) from error


def probe_sample(
    call: Callable[..., Any], sample: Sample, target: Target = CPU, label: int | None = None
) -> SampleResult | None:
    """What ``call`` returns on ``target`` for ``sample`` made channels_last; None when the
    sample does not count (its first input, or the first tensor of a list given first, as to
    ``torch.cat``, is no map, or it fails in NCHW). With ``label``, the NCHW call runs in the
    profiler range ``2 * label`` and the channels_last call in ``2 * label + 1``
    (``with_copies`` reads them)."""
    labels = (None, None) if label is None else (2 * label, 2 * label + 1)
    first = sample.input if isinstance(sample.input, torch.Tensor) else _first(sample.input)
    if not _is_map(first):
        return None
    try:
        reference = _run(call, target, sample.input, sample.args, sample.kwargs, labels[0])
    except Exception as e:  # the sample is not valid here: not counted, whatever channels_last does
        _unpredicted(target, e)
        return None
    x = map_tensors(_channels_last, sample.input)
    shown = _channels_last(first)
    assert isinstance(shown, torch.Tensor)
    seen = {"input_shape": tuple(shown.shape), "input_strides": shown.stride()}
    if shown.numel() == 0:
        return SampleResult(OpBehaviour.AMBIGUOUS, **seen, note="input: no elements")
    if layout_of(shown) is MemoryLayout.AMBIGUOUS:
        return SampleResult(OpBehaviour.AMBIGUOUS, **seen, note=f"input: {_size_one(shown)}")
    args, kwargs = map_tensors(_channels_last, (sample.args, sample.kwargs))
    try:
        producers = _Producers()
        result = _run(call, target, x, args, kwargs, labels[1], producers)
    except Exception as e:
        _unpredicted(target, e)
        return SampleResult(OpBehaviour.REFUSES, **seen, note=first_line(e)[:200])
    out, ref = _first_map(result), _first_map(reference)
    if out is None or ref is None:
        return SampleResult(OpBehaviour.NO_MAP, **seen)
    seen |= {
        "output_shape": tuple(out.shape),
        "output_strides": out.stride(),
        "producer": producers.made.get(id(out)),
    }
    if target.predicted:  # autograd's engine needs the device: the backward node by node
        if backward_problem() is None:  # else not judged (the command says why)
            seen |= _fake_gradient(call, target, x, args, kwargs)
    else:
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


def _gradient(call: Callable[..., Any], x: Any, args: Any, kwargs: Any) -> dict:
    """The first input's gradient's behaviour and strides for a channels_last gradient of the
    output, as a channels_last model's backward hands it over; nothing where none flows."""
    first = x if isinstance(x, torch.Tensor) else _first(x)
    assert first is not None
    leaf = first.detach().requires_grad_(True)
    given = map_tensors(lambda t: leaf if t is first else t, x)
    try:
        with torch.enable_grad():
            out = _first_map(call(given, *args, **kwargs))
            if out is None or not out.requires_grad:
                return {}
            grad_out = _channels_last(torch.ones_like(out, memory_format=torch.contiguous_format))
            (grad,) = torch.autograd.grad(out, leaf, grad_out, allow_unused=True)
    except Exception:  # no backward for these arguments: the gradient is not judged
        return {}
    return _gradient_seen(grad)


def _gradient_seen(grad: torch.Tensor | None) -> dict:
    if grad is None:
        return {}
    behaviour = {
        MemoryLayout.CHANNELS_LAST: OpBehaviour.KEEPS,
        MemoryLayout.CONTIGUOUS: OpBehaviour.LOSES,
        MemoryLayout.AMBIGUOUS: OpBehaviour.AMBIGUOUS,
    }.get(layout_of(grad), OpBehaviour.OTHER)
    return {"gradient": behaviour, "gradient_strides": grad.stride()}


def _fake_gradient(call: Callable[..., Any], target: Target, x: Any, args: Any, kwargs: Any):
    """``_gradient`` for fake tensors of a device this machine lacks, as ``--train --fake``
    predicts a backward: run node by node (``cl_audit.compat.backward``) on the target's fake
    tensors with its kernel-source overrides; the gradient is taken as it reaches the input
    (a hook), before ``.grad`` would lay it out as the input."""
    first = x if isinstance(x, torch.Tensor) else _first(x)
    assert first is not None
    x, args, kwargs = map_tensors(target.place, (x, args, kwargs))
    placed = x if isinstance(x, torch.Tensor) else _first(x)
    leaf = placed.detach().requires_grad_(True)
    given = map_tensors(lambda t: leaf if t is placed else t, x)
    reached: list[torch.Tensor] = []
    leaf.register_hook(reached.append)
    try:
        with target.context(), torch.enable_grad():
            out = _first_map(call(given, *args, **kwargs))
            if out is None or not out.requires_grad:
                return {}
            grad_out = _channels_last(torch.ones_like(out, memory_format=torch.contiguous_format))
            run_backward(out, gradient=grad_out)
    except Exception:  # no backward for these arguments: the gradient is not judged
        return {}
    return _gradient_seen(reached[0] if reached else None)


def _copied(copies: list[tuple[int, int | None]]) -> int:
    return sum(elements * (size or 4) for elements, size in copies)


def with_copies(
    result: SampleResult, reference: list[tuple[int, int | None]], channels_last: list
) -> SampleResult:
    """``result`` with the bytes its channels_last call copied inside kernels beyond the NCHW
    call's (``aten::copy_`` events, ``timing.copies_by_call``); an output that keeps or follows
    the order from a kernel that copied becomes ``copies``."""
    extra = _copied(channels_last) - _copied(reference)
    if extra <= 0:
        return replace(result, copied=0)
    if result.behaviour not in (OpBehaviour.KEEPS, OpBehaviour.FOLLOWS):
        return replace(result, copied=extra)
    note = f"copies {extra} B inside ({result.behaviour.value} the order)"
    return replace(result, behaviour=OpBehaviour.COPIES, copied=extra, note=note)


def operator_row(entry: OperatorEntry, target: Target = CPU) -> OperatorRow | None:
    """``entry``'s row on ``target``, or None when none of its samples counts. On real kernels
    the samples run under the profiler, which sees the copies inside them."""
    found: list[tuple[int, SampleResult]] = []
    profiler = None if target.predicted else Profiler(torch.device(target.device), shapes=True)
    try:
        with warnings.catch_warnings(), profiler or contextlib.nullcontext():
            warnings.simplefilter("ignore")  # deprecations of the database's own calls
            for n, sample in enumerate(entry.samples()):
                result = probe_sample(entry.call, sample, target, None if profiler is None else n)
                if result is not None:
                    found.append((n, result))
    except Exception as e:  # making a sample failed: a row with its error, never a crash
        return OperatorRow(entry.name, None, (), None, first_line(e)[:200])
    results = [result for _, result in found]
    if profiler is not None:
        copies, _ = copies_by_call(profiler)
        results = [
            with_copies(r, copies.get(2 * n, []), copies.get(2 * n + 1, [])) for n, r in found
        ]
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
    unjudged = backward_problem() if target.predicted else None
    return OpsIndex(
        torch.__version__,
        target.device,
        name,
        tuple(rows),
        without,
        seconds,
        predicted=target.predicted,
        gradients_not_judged=f"gradients are not judged: {unjudged}" if unjudged else None,
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
    """An operator whose behaviour (or, with ``gradient``, its input gradient's) differs
    between two indexes (None: absent from that index, its samples could not be made there,
    or for a gradient, none judged)."""

    op: str
    old: OpBehaviour | None
    new: OpBehaviour | None
    gradient: bool = False

    @property
    def better(self) -> bool | None:
        """True when the new behaviour is less bad (``OpBehaviour``'s order), False when worse,
        None when one side has none."""
        if self.old is None or self.new is None:
            return None
        return _WORST.index(self.new) > _WORST.index(self.old)


def diff(old: OpsIndex, new: OpsIndex) -> tuple[OpChange, ...]:
    """The operators whose behaviour differs from ``old`` to ``new`` (what a torch release
    fixed or broke), by name; then, for operators in both, the gradients that differ, unless
    one index judged none (``gradients_not_judged``)."""
    before = {row.op: row for row in old.rows}
    after = {row.op: row for row in new.rows}
    was = {op: row.behaviour for op, row in before.items()}
    now = {op: row.behaviour for op, row in after.items()}
    behaviour = tuple(
        OpChange(op, was.get(op), now.get(op))
        for op in sorted(was.keys() | now.keys())
        if was.get(op) != now.get(op)
    )
    if old.gradients_not_judged or new.gradients_not_judged:
        return behaviour
    gradients = tuple(
        OpChange(op, before[op].gradient, after[op].gradient, gradient=True)
        for op in sorted(before.keys() & after.keys())
        if before[op].gradient != after[op].gradient
    )
    return behaviour + gradients


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
    gradient: bool = False  # a backward operation: its rows' gradient column is what applies


_PREFIXES = ("Tensor.", "torch.", "F.", "nn.functional.")


def _bare(python_op: str) -> str:
    for prefix in _PREFIXES:
        if python_op.startswith(prefix):
            return python_op[len(prefix) :]
    return python_op


_NODE = re.compile(r"([A-Z][A-Za-z0-9]*?)Backward\d*")


def forward_of(python_op: str | None, aten_op: str | None) -> str | None:
    """The aten operation whose backward a backward operation runs, or None for a forward one:
    named by the autograd node running it (``NativeGroupNormBackward0`` runs
    ``native_group_norm``'s: derivatives.yaml names a node after its operator, in CamelCase),
    else by its own aten name (``aten.reflection_pad2d_backward``)."""
    match = _NODE.fullmatch(python_op or "")
    if match is not None:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", match[1]).lower()
        return "aten." + re.sub(r"(\d)_d(?=_|$)", r"\1d", snake)  # Pad2D: pad2d
    if aten_op is not None and aten_op.endswith("_backward"):
        return aten_op.removesuffix("_backward")
    return None


def _rows_for(index: OpsIndex, python_op: str | None, aten_op: str | None) -> tuple:
    """The index's rows for an operation: by name (``F.interpolate`` is
    ``nn.functional.interpolate`` and its variants; those whose samples' outputs the same aten
    operation made, where some are); by the aten operation alone only for a site without a
    Python name; for a backward operation, the row of the operator whose backward it runs
    (``forward_of``), whose gradient column applies."""
    forward = forward_of(python_op, aten_op)
    if forward is not None:  # the operator of that name (not those whose outputs it made:
        name = forward.removeprefix("aten.")  # a view makes many, whose backward is their own)
        return tuple(row for row in index.rows if _bare(row.op) == name)
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
        OpCost(
            python_op,
            aten_op,
            len(models[key]),
            spent[key],
            _rows_for(index, *key),
            forward_of(*key) is not None,
        )
        for key, _ in spent.most_common()
        for python_op, aten_op in (key,)
    )


@dataclass(frozen=True)
class OpLink:
    """An operation that lost channels_last in one model (an offender, or the operation a cost
    site's channels_last-only bytes are charged to), with the bytes, and the index's rows for
    it: does it always lose the format, or only with this model's arguments and strides?"""

    python_op: str | None
    aten_op: str | None
    bytes: int
    rows: tuple[OperatorRow, ...]
    gradient: bool = False  # a backward operation: its rows' gradient column is what applies

    @property
    def reading(self) -> str:
        """What the rows say of the loss, in a line."""
        counts: Counter[OpBehaviour] = Counter()
        for row in self.rows:
            counts.update(dict(row.gradient_counts if self.gradient else row.counts))
        total = sum(counts.values())
        lost = sum(counts[b] for b in (OpBehaviour.REFUSES, OpBehaviour.LOSES, OpBehaviour.OTHER))
        what = "its backward " if self.gradient else ""
        if not total:
            return f"not in the index (torch's database has no 4-D or 5-D sample of {what}it)"
        samples = "its one sample" if total == 1 else f"all {total} of its samples"
        if lost == total:
            return (
                f"{what}loses channels_last in {samples} in torch's database: the operator's to fix"
            )
        if lost:
            return (
                f"{what}loses channels_last in {lost} of its {total} samples in torch's "
                "database: only with some arguments or strides"
            )
        return (
            f"{what}keeps the order in {samples} in torch's database: lost with this model's "
            "arguments or strides, or in its code"
        )


def report_links(index: OpsIndex, report: ModelReport) -> tuple[OpLink, ...]:
    """Each operation that lost channels_last in ``report``, costliest first: the cost sites
    with channels_last-only bytes, charged as ``rank_costs`` charges them, then the offenders
    (the bytes they converted) not among them."""
    spent: Counter[tuple[str | None, str | None]] = Counter()
    for site in report.cost.sites if report.cost is not None else ():
        if site.extra > 0:
            fix = site.fix_site
            spent[(fix.python_op, fix.aten_op) if fix else (site.op, site.aten_op)] += site.extra
    converted: Counter[tuple[str | None, str | None]] = Counter()
    for finding in report.offenders:
        key = (finding.python_op, finding.aten_op)
        if key not in spent:
            converted[key] += finding.bytes_converted
    return tuple(
        OpLink(
            python_op,
            aten_op,
            n,
            _rows_for(index, python_op, aten_op),
            forward_of(python_op, aten_op) is not None,
        )
        for ledger in (spent, converted)
        for (python_op, aten_op), n in ledger.most_common()
    )
