"""The cases an operator of the index is judged in (``cl-audit ops``), made from its database
samples:

- ``samples``: the database's own samples whose first input is a 4-D or 5-D map (a sample
  that asks for NCHW by name, ``memory_format=torch.contiguous_format``, is left out: that
  output's order is the caller's);
- ``raised``: samples of another rank raised to 4-D where that keeps what the operator means:
  each tensor of the first input's shape gets leading dimensions, ``(2, 3, 5, 7)`` from the
  left (a (M, K) matrix becomes (2, 3, M, K): matrix operators work on the last two), its
  values repeated (indices stay valid), and with it a lower-rank tensor aligned with its
  leading dimensions (an LU's pivots); other tensors broadcast as they were, or, in a second
  raise where some have the first input's rank (a gather's index, an index_add's source), get
  the same leading dimensions, and in a third a shape among its arguments (``expand``'s size)
  the same leading sizes; a dimension the sample names (``dim`` where the operator's
  schema takes it) moved with its axis;
- ``dim=C`` (``N``, ``H``, ``W``; ``keepdim`` both ways where the schema takes it): a raised
  sample with its dimension put on each axis in turn, for reductions, scans and sorts;
- mixed layouts, from the first 4-D sample with operands of its shape (a list's other tensors,
  as ``torch.cat`` takes them): ``channels_last + NCHW``, ``NCHW + channels_last``,
  ``channels_last + (1, C, 1, 1)``, ``channels_last + scalar`` (the first operand so made),
  ``in-place`` (a channels_last input, NCHW operands) and ``out=`` (channels_last operands, an
  empty ``out`` that the operator sizes): which layout the output takes in each.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cl_audit.compat.opinfo import OperatorEntry, Sample
from cl_audit.compat.pytree import map_tensors
from cl_audit.execution.convert import channels_last_format

__all__ = ["GENERIC", "MIXED", "RAISED", "SAMPLES", "Case", "cases", "channels_last"]

SAMPLES = "samples"
RAISED = "raised"
MIXED = (
    "channels_last + NCHW",
    "NCHW + channels_last",
    "channels_last + (1, C, 1, 1)",
    "channels_last + scalar",
    "in-place",
    "out=",
)
GENERIC = (2, 3, 5, 7)
_AXES = "NCHW"
_RAISED_TRIED = 3  # database samples raised per operator: those of the highest rank
_LOWER_READ = 12  # samples of a rank below 4 read to choose them from
_DIM_SAMPLES = 2  # raised samples whose dimension is moved over N, C, H and W


@dataclass(frozen=True)
class Case:
    """One call to judge: its case label, the call, the sample, and whether its tensors' layouts
    are given as they are (a mixed case: the channels_last call runs the sample as given, the
    NCHW call with every tensor contiguous)."""

    label: str
    call: Callable[..., Any]
    sample: Sample
    mixed: bool = False


def _is_map(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() in (4, 5)


def _first(value: object) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def cases(entry: OperatorEntry) -> Iterator[Case]:
    """Every case of ``entry``, database samples first (see the module docstring)."""
    lower: list[tuple[int, Sample]] = []
    maps: list[Sample] = []
    for sample in entry.samples():
        first = _first(sample.input)
        if first is None or sample.kwargs.get("memory_format") is torch.contiguous_format:
            continue  # no tensor; or NCHW asked for by name (x.float(memory_format=...))
        if _is_map(first):
            maps.append(sample)
            yield Case(SAMPLES, entry.call, sample)
        elif len(lower) < _LOWER_READ and first.dim() < 4:
            lower.append((first.dim(), sample))
    raised: list[Sample] = []
    for rank, sample in sorted(lower, key=lambda pair: -pair[0])[:_RAISED_TRIED]:
        raised.append(_raised(sample, rank, entry.dim_position, same_rank=False))
        if _ranked_alike(sample, rank):  # indices, sources: raised with it, or no call
            raised.append(_raised(sample, rank, entry.dim_position, same_rank=True))
        if _sized(sample, rank):  # sizes as long as the rank (expand, reshape): raised too
            raised.append(_raised(sample, rank, entry.dim_position, same_rank=True, sizes=True))
    for sample in raised:
        yield Case(RAISED, entry.call, sample)
    with_dim = [s for s in raised if _dim_of(s, entry.dim_position) is not None]
    for sample in with_dim[:_DIM_SAMPLES]:
        yield from _over_each_axis(entry, sample)
    bases = maps or raised
    if bases:  # the first with an operand of its input's shape, else the first
        yield from _mixed(entry, next((b for b in bases if _operands(b)), bases[0]))


def _batch_aligned(t: torch.Tensor, shape: torch.Size) -> bool:
    """Whether ``t``, of a lower rank than a tensor of ``shape``, holds one value per leading
    entry of it (an LU's pivots beside its factor): it does not broadcast against it, and its
    shape is its leading dimensions. Raised with it, or the two would be misaligned (torch
    2.4.1's ``lu_unpack`` then corrupts memory and aborts the process)."""
    if not 0 < t.dim() < len(shape) or t.shape != shape[: t.dim()]:
        return False
    try:
        torch.broadcast_shapes(t.shape, shape)
    except RuntimeError:
        return True
    return False


def _ranked_alike(sample: Sample, rank: int) -> bool:
    """Whether a tensor of the sample has the first input's rank but another shape."""
    first = _first(sample.input)
    tensors = [v for v in _flat(sample) if isinstance(v, torch.Tensor)]
    return first is not None and any(t.dim() == rank and t.shape != first.shape for t in tensors)


def _sizes(value: object, rank: int) -> bool:
    """Whether ``value`` is a sequence of ``rank`` integers (a shape: ``expand``'s size)."""
    return (
        isinstance(value, (tuple, list, torch.Size))
        and len(value) == rank
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def _sized(sample: Sample, rank: int) -> bool:
    return rank > 0 and any(_sizes(v, rank) for v in (*sample.args, *sample.kwargs.values()))


def _raised(
    sample: Sample, rank: int, dim_position: int | None, same_rank: bool, sizes: bool = False
) -> Sample:
    """``sample`` with every tensor of its first input's shape (``same_rank``: of its rank:
    an index or a source beside it) given the leading dimensions ``GENERIC[: 4 - rank]``
    (values repeated), its dimension moved with its axis; with ``sizes`` a sequence of
    ``rank`` integers among the arguments (a shape) given the same leading sizes."""
    first = _first(sample.input)
    assert first is not None
    shape, prefix = first.shape, GENERIC[: 4 - rank]

    def raise_(t: torch.Tensor) -> torch.Tensor:
        alike = t.shape == shape or (same_rank and t.dim() == rank)
        if not alike and not _batch_aligned(t, shape):
            return t
        return t.expand(*prefix, *t.shape).contiguous()

    given, args, kwargs = map_tensors(raise_, (sample.input, sample.args, sample.kwargs))
    if sizes:
        args = tuple((*prefix, *v) if _sizes(v, rank) else v for v in args)
        kwargs = {k: (*prefix, *v) if _sizes(v, rank) else v for k, v in kwargs.items()}
    dim = _dim_of(sample, dim_position)
    if isinstance(dim, int) and 0 <= dim < rank:  # a scalar's dim 0 names no axis: as given
        args, kwargs = _with_dim(args, kwargs, dim_position, dim + len(prefix))
    return Sample(given, tuple(args), dict(kwargs))


def _dim_of(sample: Sample, position: int | None) -> int | None:
    """The dimension the sample names: ``dim=`` or the schema's position; None if none (or
    not one integer)."""
    if "dim" in sample.kwargs:
        dim = sample.kwargs["dim"]
    elif position is not None and len(sample.args) > position:
        dim = sample.args[position]
    else:
        return None
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


def _with_dim(
    args: tuple[Any, ...], kwargs: dict[str, Any], position: int | None, dim: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if "dim" in kwargs or position is None or len(args) <= position:
        return args, {**kwargs, "dim": dim}
    return (*args[:position], dim, *args[position + 1 :]), kwargs


def _over_each_axis(entry: OperatorEntry, sample: Sample) -> Iterator[Case]:
    keepdims: tuple[bool | None, ...] = (False, True) if entry.keepdim else (None,)
    for (axis, name), keepdim in itertools.product(enumerate(_AXES), keepdims):
        args, kwargs = _with_dim(sample.args, sample.kwargs, entry.dim_position, axis)
        label = f"dim={name}"
        if keepdim is not None:
            kwargs = {**kwargs, "keepdim": keepdim}
            label += " keepdim" if keepdim else ""
        yield Case(label, entry.call, Sample(sample.input, args, kwargs))


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """A 4-D or 5-D tensor (of any dtype: pooling's indices too) made channels_last; any
    other as it is."""
    return t.contiguous(memory_format=channels_last_format(t.dim())) if t.dim() in (4, 5) else t


def _mixed(entry: OperatorEntry, base: Sample) -> Iterator[Case]:
    """The mixed-layout cases of ``base`` (whose first input is a map; see the docstring)."""
    first = _first(base.input)
    assert first is not None
    shape = first.shape
    listed = not isinstance(base.input, torch.Tensor)
    operands = _operands(base)
    if operands:
        one = operands[0]
        yield _case(entry.call, MIXED[0], base, lambda i, t: t if i else channels_last(t))
        yield _case(entry.call, MIXED[1], base, lambda i, t: channels_last(t) if i else t)
        bias = (1, shape[1], *([1] * (len(shape) - 2)))
        yield _case(entry.call, MIXED[2], base, _replacing(one, lambda t: t.new_ones(bias)))
        if not listed:  # a list of scalars is not what torch.cat takes
            yield _case(entry.call, MIXED[3], base, _replacing(one, lambda t: t.new_tensor(1.5)))
    if entry.inplace is not None and not listed:
        yield _case(entry.inplace, MIXED[4], base, lambda i, t: t if i else channels_last(t))
    if entry.supports_out:
        out = _with_out(entry.call)
        yield _case(out, MIXED[5], base, lambda i, t: channels_last(t))


def _operands(sample: Sample) -> list[int]:
    """Where the sample's tensors of its first input's shape are, after it (``_flat``)."""
    first = _first(sample.input)
    return [
        i for i, t in enumerate(_flat(sample))
        if i > 0 and first is not None and isinstance(t, torch.Tensor) and t.shape == first.shape
    ]  # fmt: skip


def _replacing(index: int, make: Callable[[torch.Tensor], torch.Tensor]):
    """The first input channels_last and the operand at ``index`` made by ``make``."""

    def layout(i: int, t: torch.Tensor) -> torch.Tensor:
        if i == index:
            return make(t)
        return channels_last(t) if _is_map(t) else t

    return layout


def _flat(sample: Sample) -> list[object]:
    """The sample's values in order: the first input (each of a list's), then the arguments."""
    given = list(sample.input) if isinstance(sample.input, (list, tuple)) else [sample.input]
    return [*given, *sample.args, *sample.kwargs.values()]


def _case(
    call: Callable[..., Any],
    label: str,
    sample: Sample,
    layout: Callable[[int, torch.Tensor], torch.Tensor],
) -> Case:
    """``sample`` with each of its top-level tensors (numbered as ``_flat`` numbers them) laid
    out by ``layout``; others as they are."""
    values = iter(range(len(_flat(sample))))

    def place(value: object) -> object:
        index = next(values)
        return layout(index, value) if isinstance(value, torch.Tensor) else value

    if isinstance(sample.input, (list, tuple)):
        given: object = type(sample.input)(place(v) for v in sample.input)
    else:
        given = place(sample.input)
    args = tuple(place(v) for v in sample.args)
    kwargs = {k: place(v) for k, v in sample.kwargs.items()}
    return Case(label, call, Sample(given, args, kwargs), mixed=True)


def _with_out(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` writing into a new empty ``out`` tensor of its first input's dtype and device,
    which the operator sizes (and lays out) itself."""

    def with_out(x: Any, *args: Any, **kwargs: Any) -> Any:
        first = _first(x)
        assert first is not None
        return call(x, *args, out=first.new_empty(0), **kwargs)

    return with_out
