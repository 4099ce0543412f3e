"""Samples of a lower rank raised to 4-D for the operator index (``cases``' ``raised``), where
that keeps what the operator means: each tensor of the first input's shape gets leading
dimensions, ``(2, 3, 5, 7)`` from the left (a (M, K) matrix becomes (2, 3, M, K): matrix
operators work on the last two), its values repeated (indices stay valid), and with it a
lower-rank tensor aligned with its leading dimensions (an LU's pivots); other tensors broadcast
as they were, or, in a second raise where some have the first input's rank (a gather's index,
an index_add's source) or are aligned with it (the input without the dimension it names:
``select_scatter``'s source), get the same leading dimensions, and in a third a shape among its
arguments (``expand``'s size) the same leading sizes. Each raise moves with its axis the
dimensions the sample names (``dim`` or ``axis``, and the schema's other dimension arguments:
``dim1``, ``start_dim``, ``source``, given or by default: a diagonal stays the matrix's), gives
a list of index tensors (``index_put``'s) one that takes each new dimension whole, and an
einsum equation an ellipsis for each raised operand; where the sample's tensors broadcast to a
larger shape than its first input's (``broadcast_tensors``), the first input is widened to it,
then raised."""

from __future__ import annotations

from typing import Any

import torch

from cl_audit.compat.opinfo import DimArgument, OperatorEntry, Sample
from cl_audit.compat.pytree import map_tensors

__all__ = ["GENERIC", "dim_of", "first_tensor", "flat", "raised_samples", "with_dim"]

GENERIC = (2, 3, 5, 7)


def raised_samples(entry: OperatorEntry, sample: Sample, rank: int) -> list[Sample]:
    """``sample``, whose first input has ``rank`` below 4, raised (the module docstring)."""
    position, moved = entry.dim_position, entry.dim_arguments
    raised = [_raised(sample, rank, position, moved, same_rank=False)]
    wider = _widened(sample)
    if wider is not None and dim_of(sample, position) is None:
        raised.append(_raised(wider, len(_shape(wider)), position, moved, same_rank=False))
    if _ranked_alike(sample, rank, position):  # indices, sources: raised too
        raised.append(_raised(sample, rank, position, moved, same_rank=True))
    if _sized(sample, rank):  # sizes as long as the rank (expand, reshape): raised too
        raised.append(_raised(sample, rank, position, moved, same_rank=True, sizes=True))
    return raised


def first_tensor(value: object) -> torch.Tensor | None:
    """A sample's first input, or the first tensor of a list given first (``torch.cat``'s)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def flat(sample: Sample) -> list[object]:
    """The sample's values in order: the first input (each of a list's), then the arguments."""
    given = list(sample.input) if isinstance(sample.input, (list, tuple)) else [sample.input]
    return [*given, *sample.args, *sample.kwargs.values()]


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


def _shape(sample: Sample) -> torch.Size:
    first = first_tensor(sample.input)
    assert first is not None
    return first.shape


def _widened(sample: Sample) -> Sample | None:
    """``sample`` with its first input expanded to the shape its tensors broadcast to, where
    that shape is larger than the first input's and of a rank below 4; else None."""
    first = first_tensor(sample.input)
    shapes = [t.shape for t in flat(sample) if isinstance(t, torch.Tensor)]
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
    first = first_tensor(sample.input)
    if first is None:
        return False
    dim = dim_of(sample, dim_position)
    return any(
        (t.dim() == rank and t.shape != first.shape)
        or (_aligned(t, first.shape, dim) and not _batch_aligned(t, first.shape))
        for t in flat(sample)
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
    """Whether a shape of ``rank`` integers is among the sample's arguments."""
    return rank > 0 and any(_sizes(v, rank) for v in (*sample.args, *sample.kwargs.values()))


def _raised(
    sample: Sample,
    rank: int,
    dim_position: int | None,
    moved: tuple[DimArgument, ...],
    same_rank: bool,
    sizes: bool = False,
) -> Sample:
    """``sample`` with every tensor of its first input's shape (``same_rank``: of its rank:
    an index or a source beside it) given the leading dimensions ``GENERIC[: 4 - rank]``
    (values repeated), its dimension moved with its axis; with ``sizes`` a sequence of
    ``rank`` integers among the arguments (a shape) given the same leading sizes."""
    first = first_tensor(sample.input)
    assert first is not None
    shape, prefix = first.shape, GENERIC[: 4 - rank]
    dim = dim_of(sample, dim_position)
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
    args, kwargs = _moved(args, kwargs, moved, rank, len(prefix))
    if isinstance(dim, int) and 0 <= dim < rank:  # a scalar's dim 0 names no axis: as given
        args, kwargs = with_dim(args, kwargs, dim_position, dim + len(prefix))
    return Sample(given, tuple(args), dict(kwargs))


def _moved(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    arguments: tuple[DimArgument, ...],
    rank: int,
    by: int,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with each dimension argument (an integer ``dim`` aside: moved
    with its axis cases) that names axes from the front moved ``by`` the new leading
    dimensions: given by keyword or at its schema position, or by its default (then passed by
    keyword: ``diagonal``'s ``dim1=0, dim2=1``)."""
    for argument in arguments:
        at = argument.position
        given = argument.name in kwargs or (at is not None and len(args) > at)
        if argument.name in kwargs:
            value = kwargs[argument.name]
        elif given:
            value = args[at]  # type: ignore[index]
        else:
            value = argument.default
        shifted = _shifted(value, rank, by)
        if shifted is None or (argument.name == "dim" and isinstance(value, int)):
            continue
        if given and argument.name not in kwargs:
            args = (*args[:at], shifted, *args[at + 1 :])  # type: ignore[operator]
        else:
            kwargs = {**kwargs, argument.name: shifted}
    return args, kwargs


def _shifted(value: object, rank: int, by: int) -> object:
    """``value``, a dimension or a sequence of them, with those counted from the front of a
    tensor of ``rank`` moved ``by``; None where none is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value + by if 0 <= value < rank else None
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    if not any(0 <= v < rank for v in value):
        return None
    return type(value)(v + by if 0 <= v < rank else v for v in value)


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


def dim_of(sample: Sample, position: int | None) -> int | None:
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


def with_dim(
    args: tuple[Any, ...], kwargs: dict[str, Any], position: int | None, dim: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` naming ``dim`` where the sample named its dimension: by its
    keyword, else at the schema's position, else as ``dim=``."""
    named = next((k for k in _DIM_NAMES if k in kwargs), None)
    if named is not None or position is None or len(args) <= position:
        return args, {**kwargs, named or "dim": dim}
    return (*args[:position], dim, *args[position + 1 :]), kwargs
