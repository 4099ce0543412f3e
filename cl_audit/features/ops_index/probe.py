"""Runs the operator coverage index: each sample of torch's operator database in NCHW and in
channels_last, on this device or on fake tensors of one it lacks, judged by its output's layout
and its input gradient's; the rows and the index built from them."""

from __future__ import annotations

import contextlib
import fnmatch
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
from cl_audit.report.ops_report import WORST, OperatorRow, OpsIndex, SampleResult
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = [
    "CPU",
    "Target",
    "build_index",
    "operator_row",
    "probe_sample",
    "select",
    "target_for",
    "with_copies",
]


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
    worst = next(b for b in WORST if counts[b])
    example = next(r for r in results if r.behaviour is worst)
    ordered = tuple((b, counts[b]) for b in WORST if counts[b])
    made = tuple(sorted({r.producer for r in results if r.producer is not None}))
    graded = Counter(r.gradient for r in results if r.gradient is not None)
    return OperatorRow(
        entry.name,
        worst,
        ordered,
        example,
        aten_ops=made,
        gradient=next((b for b in WORST if graded[b]), None),
        gradient_counts=tuple((b, graded[b]) for b in WORST if graded[b]),
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
