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
from dataclasses import replace
from typing import Any

import torch
from torch.profiler import record_function

from cl_audit.compat.failures import is_device_runtime_error
from cl_audit.compat.operators import aten_op_name
from cl_audit.compat.opinfo import OperatorEntry, Sample
from cl_audit.compat.pytree import map_tensors, tensor_leaves
from cl_audit.enums import Engine, OpBehaviour
from cl_audit.errors import first_line
from cl_audit.execution.audit_context import watching
from cl_audit.execution.timing import Profiler, copies_by_call
from cl_audit.fake.backward import backward_problem
from cl_audit.features.ops_index.cases import Case, cases, channels_last, generic_cases
from cl_audit.features.ops_index.gradient import first_map, input_gradient
from cl_audit.features.ops_index.raising import first_tensor
from cl_audit.features.ops_index.target import CPU, Target
from cl_audit.intercept.dispatch import CALL_LABEL
from cl_audit.report.environment import dtype_name
from cl_audit.report.ops_report import (
    WORST,
    CaseRow,
    OperatorRow,
    OpsIndex,
    SampleResult,
    Unjudged,
)
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = [
    "build_index",
    "operator_row",
    "probe_sample",
    "select",
    "with_copies",
]


def _is_map(value: object, any_dtype: bool = False) -> bool:
    spatial = isinstance(value, torch.Tensor) and value.dim() in (4, 5)
    return spatial and (any_dtype or value.is_floating_point())


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous()


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
    call: Callable[..., Any],
    sample: Sample,
    target: Target = CPU,
    label: int | None = None,
    as_given: bool = False,
    errors: list[str] | None = None,
    any_dtype: bool = False,
) -> SampleResult | None:
    """What ``call`` returns on ``target`` for ``sample`` made channels_last (``as_given``:
    the sample as it is, a mixed layout, against every tensor contiguous; no gradient judged);
    None when the sample does not count (its first input, or the first tensor of a list given
    first, as to ``torch.cat``, is no map, or it fails in NCHW: the error's first line then
    goes to ``errors``; ``any_dtype``: a first input of any dtype counts, for an operator
    judged in its own). With ``label``, the NCHW call runs in the profiler range ``2 * label``
    and the channels_last call in ``2 * label + 1`` (``with_copies`` reads them)."""
    labels = (None, None) if label is None else (2 * label, 2 * label + 1)
    first = sample.input if isinstance(sample.input, torch.Tensor) else _first(sample.input)
    if not _is_map(first, any_dtype):
        return None
    nchw = Sample(*map_tensors(_contiguous, (sample.input, sample.args, sample.kwargs)))
    nchw = nchw if as_given else sample
    try:
        reference = _run(call, target, nchw.input, nchw.args, nchw.kwargs, labels[0])
    except Exception as e:  # the sample is not valid here: not counted, whatever channels_last does
        _unpredicted(target, e)
        if errors is not None:
            errors.append(first_line(e)[:200])
        return None
    x = sample.input if as_given else map_tensors(channels_last, sample.input)
    shown = first if as_given else channels_last(first)
    assert isinstance(shown, torch.Tensor)
    seen = {"input_shape": tuple(shown.shape), "input_strides": shown.stride()}
    if shown.numel() == 0:
        return SampleResult(OpBehaviour.AMBIGUOUS, **seen, note="input: no elements")
    if layout_of(shown) is MemoryLayout.AMBIGUOUS:
        return SampleResult(OpBehaviour.AMBIGUOUS, **seen, note=f"input: {_size_one(shown)}")
    args, kwargs = (
        (sample.args, sample.kwargs)
        if as_given
        else map_tensors(channels_last, (sample.args, sample.kwargs))
    )
    try:
        producers = _Producers()
        result = _run(call, target, x, args, kwargs, labels[1], producers)
    except Exception as e:
        _unpredicted(target, e)
        return SampleResult(OpBehaviour.REFUSES, **seen, note=first_line(e)[:200])
    out, ref = first_map(result), first_map(reference)
    if out is None or ref is None:
        return SampleResult(OpBehaviour.NO_MAP, **seen)
    seen |= {
        "output_shape": tuple(out.shape),
        "output_strides": out.stride(),
        "producer": producers.made.get(id(out)),
    }
    # a mixed layout says which layout the output takes, no gradient judged; a predicted
    # device's needs torch's backward run node by node (else the command says why not)
    if not as_given and not (target.predicted and backward_problem() is not None):
        seen |= input_gradient(call, target, x, args, kwargs)
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


def operator_row(entry: OperatorEntry, target: Target = CPU) -> OperatorRow | Unjudged:
    """``entry``'s row on ``target`` from its cases (``cases``), or why it has none. On real
    kernels the samples run under the profiler, which sees the copies inside them."""
    if entry.unsupported is not None:
        return Unjudged(entry.name, entry.unsupported)
    found: list[tuple[int, str, bool, SampleResult]] = []
    errors: list[str] = []
    own = f" ({entry.dtype})" if entry.dtype else ""
    made = 0
    profiler = None if target.predicted else Profiler(torch.device(target.device), shapes=True)
    try:
        with warnings.catch_warnings(), profiler or contextlib.nullcontext():
            warnings.simplefilter("ignore")  # deprecations of the database's own calls
            for n, case in enumerate(_judged_cases(entry, found)):
                made = n + 1
                label = None if profiler is None else n
                result = probe_sample(
                    case.call,
                    case.sample,
                    target,
                    label,
                    as_given=case.mixed,
                    errors=errors,
                    any_dtype=entry.dtype is not None,
                )
                if result is not None:
                    found.append((n, case.label + own, case.mixed, result))
    except Exception as e:  # making a sample failed: a row with its error, never a crash
        return OperatorRow(entry.name, None, (), None, first_line(e)[:200])
    if profiler is not None:
        copies, _ = copies_by_call(profiler)
        found = [
            (n, case, mixed, with_copies(r, copies.get(2 * n, []), copies.get(2 * n + 1, [])))
            for n, case, mixed, r in found
        ]
    results = [r for _, _, mixed, r in found if not mixed]
    if not results:
        return Unjudged(entry.name, _reason(entry, made, errors))
    by_case: dict[tuple[str, bool], list[SampleResult]] = {}
    for _, case, mixed, result in found:
        by_case.setdefault((case, mixed), []).append(result)
    worst, counts, example = _worst(results)
    producers = tuple(sorted({r.producer for r in results if r.producer is not None}))
    graded = Counter(r.gradient for r in results if r.gradient is not None)
    return OperatorRow(
        entry.name,
        worst,
        counts,
        example,
        aten_ops=producers,
        gradient=next((b for b in WORST if graded[b]), None),
        gradient_counts=tuple((b, graded[b]) for b in WORST if graded[b]),
        cases=tuple(CaseRow(case, *_worst(rs), mixed) for (case, mixed), rs in by_case.items()),
    )


def _judged_cases(entry: OperatorEntry, found: list) -> Iterator[Case]:
    """``entry``'s cases, then, where none of its own has a result in ``found`` (filled as
    they run), its ``generic`` ones."""
    yield from cases(entry)
    if not any(not mixed for _, _, mixed, _ in found):
        yield from generic_cases(entry)


def _worst(
    results: list[SampleResult],
) -> tuple[OpBehaviour, tuple[tuple[OpBehaviour, int], ...], SampleResult]:
    """The worst behaviour of ``results``, the count of each, and the first of the worst."""
    counts = Counter(r.behaviour for r in results)
    worst = next(b for b in WORST if counts[b])
    example = next(r for r in results if r.behaviour is worst)
    return worst, tuple((b, counts[b]) for b in WORST if counts[b]), example


def _reason(entry: OperatorEntry, made: int, errors: list[str]) -> str:
    """Why an operator has no row: no case could be made from its samples (none takes a
    tensor first: a factory, a scalar's; its first tensors are sparse; or each asks for NCHW by
    name), or none ran in NCHW."""
    if not made:
        samples = list(entry.samples())
        if any(s.kwargs.get("memory_format") is torch.contiguous_format for s in samples):
            return "every sample asks for NCHW by name (memory_format=torch.contiguous_format)"
        firsts = [first_tensor(s.input) for s in samples]
        sparse = {str(t.layout).removeprefix("torch.") for t in firsts if t is not None}
        sparse.discard("strided")
        if sparse:
            return f"its samples' first input is sparse ({', '.join(sorted(sparse))}): no strides"
        return "no sample takes a tensor first (a factory, or an operator of scalars)"
    if not errors:
        return "no sample's first input is a floating-point tensor"
    return f"no sample runs with a 4-D input: {Counter(errors).most_common(1)[0][0]}"


def build_index(entries: Iterable[OperatorEntry], target: Target, dtype: torch.dtype) -> OpsIndex:
    """Every operator's row on ``target``, the random samples seeded (0) for a repeatable
    index (made on the CPU, then placed)."""
    start = time.perf_counter()
    torch.manual_seed(0)
    rows: list[OperatorRow] = []
    unjudged: list[Unjudged] = []
    for entry in entries:
        row = operator_row(entry, target)
        if isinstance(row, Unjudged):
            unjudged.append(row)
        else:
            rows.append(row)
    name = dtype_name(dtype)
    seconds = time.perf_counter() - start
    problem = backward_problem() if target.predicted else None
    return OpsIndex(
        torch.__version__,
        target.device,
        name,
        tuple(rows),
        len(unjudged),
        seconds,
        predicted=target.predicted,
        gradients_not_judged=f"gradients are not judged: {problem}" if problem else None,
        unjudged=tuple(unjudged),
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
