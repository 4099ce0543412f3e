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
  schema takes it, or ``axis``) moved with its axis; a list of index tensors (``index_put``'s)
  given one that takes each new dimension whole; an einsum equation an ellipsis for
  each raised operand; where the sample's tensors broadcast to a larger shape than its first
  input's (``broadcast_tensors``), the first input expanded to it, then raised;
- ``generic``: where no other case runs, the first input (each tensor of a list given first)
  replaced by a ``(2, 3, 5, 7)`` tensor, the other arguments as they were (``generic_cases``);
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

__all__ = [
    "GENERIC",
    "MIXED",
    "RAISED",
    "SAMPLES",
    "Case",
    "cases",
    "channels_last",
    "generic_cases",
]

SAMPLES = "samples"
RAISED = "raised"
GENERIC_CASE = "generic"
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
        wider = _broadcast_first(sample)
        if wider is not None and _dim_of(sample, entry.dim_position) is None:  # widened, raised
            raised.append(_raised(wider, len(_shape(wider)), entry.dim_position, same_rank=False))
        if _ranked_alike(sample, rank, entry.dim_position):  # indices, sources: raised too
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


def generic_cases(entry: OperatorEntry) -> Iterator[Case]:
    """The ``generic`` case of each of the first samples that take a tensor first: that tensor
    (each of a list given first) replaced by a ``GENERIC`` one of its dtype, the rest as given
    (``torch.column_stack``'s pair of 3-D tensors that differ in their second dimension)."""
    made = 0
    for sample in entry.samples():
        if made == _RAISED_TRIED:
            return
        if _first(sample.input) is None:
            continue
        made += 1

        def generic(t: torch.Tensor) -> torch.Tensor:
            return torch.randn(GENERIC, device=t.device).to(t.dtype)

        if isinstance(sample.input, torch.Tensor):
            given: object = generic(sample.input)
        else:
            given = type(sample.input)(
                generic(v) if isinstance(v, torch.Tensor) else v for v in sample.input
            )
        yield Case(GENERIC_CASE, entry.call, Sample(given, sample.args, sample.kwargs))


def _shape(sample: Sample) -> torch.Size:
    first = _first(sample.input)
    assert first is not None
    return first.shape


def _broadcast_first(sample: Sample) -> Sample | None:
    """``sample`` with its first input expanded to the shape its tensors broadcast to, where
    that shape is larger than the first input's and of a rank below 4; else None."""
    first = _first(sample.input)
    shapes = [t.shape for t in _flat(sample) if isinstance(t, torch.Tensor)]
    try:
        shape = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return None
    if first is None or shape == first.shape or len(shape) >= 4:
        return None
    wide = first.expand(shape).contiguous()
    given = wide if sample.input is first else type(sample.input)([wide, *sample.input[1:]])
    return Sample(given, sample.args, sample.kwargs)


def _ranked_alike(sample: Sample, rank: int, dim_position: int | None) -> bool:
    """Whether a tensor of the sample has the first input's rank but another shape, or is
    aligned with it (``_aligned``) where the first raise leaves it."""
    first = _first(sample.input)
    if first is None:
        return False
    dim = _dim_of(sample, dim_position)
    return any(
        (t.dim() == rank and t.shape != first.shape)
        or (_aligned(t, first.shape, dim) and not _batch_aligned(t, first.shape))
        for t in _flat(sample)
        if isinstance(t, torch.Tensor)
    )


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
    dim = _dim_of(sample, dim_position)
    raised: set[int] = set()

    def raise_(t: torch.Tensor) -> torch.Tensor:
        alike = t.shape == shape or (same_rank and (t.dim() == rank or _aligned(t, shape, dim)))
        if not alike and not _batch_aligned(t, shape):
            return t
        wide = t.expand(*prefix, *t.shape).contiguous()
        raised.add(id(wide))
        return wide

    def raise_argument(value: object) -> object:  # index lists: the new dimensions whole
        return (*_whole(prefix, value), *value) if _indices(value) else map_tensors(raise_, value)

    given = map_tensors(raise_, sample.input)
    args = tuple(raise_argument(v) for v in sample.args)
    kwargs = {k: raise_argument(v) for k, v in sample.kwargs.items()}
    if isinstance(given, (list, tuple)):  # an einsum's operands: an ellipsis where raised
        flags = [id(v) in raised for v in given]
        args = tuple(_with_ellipsis(v, flags) if isinstance(v, str) else v for v in args)
    if sizes:
        args = tuple((*prefix, *v) if _sizes(v, rank) else v for v in args)
        kwargs = {k: (*prefix, *v) if _sizes(v, rank) else v for k, v in kwargs.items()}
    if isinstance(dim, int) and 0 <= dim < rank:  # a scalar's dim 0 names no axis: as given
        args, kwargs = _with_dim(args, kwargs, dim_position, dim + len(prefix))
    return Sample(given, tuple(args), dict(kwargs))


def _aligned(t: torch.Tensor, shape: torch.Size, dim: int | None) -> bool:
    """Whether ``t``'s shape is the leading dimensions of ``shape`` (an LU's pivots) or
    ``shape`` without the dimension the sample names (``select_scatter``'s source)."""
    if 0 < t.dim() < len(shape) and t.shape == shape[: t.dim()]:
        return True
    if not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        return False
    axis = dim % len(shape)
    return t.shape == shape[:axis] + shape[axis + 1 :]


def _indices(value: object) -> bool:
    """Whether ``value`` is a list of index tensors (``index_put``'s ``indices``): each an
    integer or boolean tensor."""
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(
            isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex())
            for v in value
        )
    )


def _whole(prefix: tuple[int, ...], indices: list | tuple) -> tuple[torch.Tensor, ...]:
    """Index tensors that take the new leading dimensions ``prefix`` whole, each an ``arange``
    that broadcasts with the others and with ``indices`` (a boolean mask indexes as one
    dimension): ``x[:, :, i]`` as ``x[a, b, i]``, which torch's Python calls take where they
    refuse None."""
    rank = max(1 if t.dtype == torch.bool else t.dim() for t in indices)
    return tuple(
        torch.arange(n).view(n, *([1] * (len(prefix) - 1 - j + rank))) for j, n in enumerate(prefix)
    )


def _with_ellipsis(equation: str, raised: list[bool]) -> str:
    """An einsum ``equation`` with ``...`` before the subscripts of each raised operand and of
    an explicit output; any other string as it is."""
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(raised) or not all(t.strip().isalpha() for t in terms):
        return equation
    terms = [f"...{t.strip()}" if up else t for t, up in zip(terms, raised, strict=True)]
    return ",".join(terms) + (f"->...{output.strip()}" if arrow and any(raised) else arrow + output)


_DIM_NAMES = ("dim", "axis")  # the keywords a sample names its dimension by


def _dim_of(sample: Sample, position: int | None) -> int | None:
    """The dimension the sample names: ``dim=`` (``axis=``) or the schema's position; None if
    none (or not one integer)."""
    named = next((k for k in _DIM_NAMES if k in sample.kwargs), None)
    if named is not None:
        dim = sample.kwargs[named]
    elif position is not None and len(sample.args) > position:
        dim = sample.args[position]
    else:
        return None
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


def _with_dim(
    args: tuple[Any, ...], kwargs: dict[str, Any], position: int | None, dim: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    named = next((k for k in _DIM_NAMES if k in kwargs), None)
    if named is not None or position is None or len(args) <= position:
        return args, {**kwargs, named or "dim": dim}
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
