"""The cases an operator of the index is judged in (``cl-audit ops``), made from its database
samples:

- ``samples``: the database's own samples whose first input is a 4-D or 5-D map (a sample
  that asks for NCHW by name, ``memory_format=torch.contiguous_format``, is left out: that
  output's order is the caller's);
- ``raised``: samples of another rank raised to 4-D where that keeps what the operator means
  (``raising``: leading dimensions ``(2, 3, 5, 7)`` from the left, the dimensions the sample
  names moved with their axes);
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
from cl_audit.execution.convert import channels_last_format
from cl_audit.features.ops_index.raising import (
    GENERIC,
    dim_of,
    first_tensor,
    flat,
    raised_samples,
    with_dim,
)

__all__ = ["MIXED", "RAISED", "SAMPLES", "Case", "cases", "channels_last", "generic_cases"]

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


def _strided(first: torch.Tensor | None) -> bool:
    """Whether a sample's first tensor is one that has strides (a sparse one has no order)."""
    return first is not None and first.layout is torch.strided


def cases(entry: OperatorEntry) -> Iterator[Case]:
    """Every case of ``entry``, database samples first (see the module docstring)."""
    lower: list[tuple[int, Sample]] = []
    maps: list[Sample] = []
    for sample in entry.samples():
        first = first_tensor(sample.input)
        if not _strided(first) or sample.kwargs.get("memory_format") is torch.contiguous_format:
            continue  # no tensor, or a sparse one; or NCHW asked by name (x.float(memory_format=))
        if _is_map(first):
            maps.append(sample)
            yield Case(SAMPLES, entry.call, sample)
        elif len(lower) < _LOWER_READ and first.dim() < 4:
            lower.append((first.dim(), sample))
    raised: list[Sample] = []
    for rank, sample in sorted(lower, key=lambda pair: -pair[0])[:_RAISED_TRIED]:
        raised.extend(raised_samples(entry, sample, rank))
    for sample in raised:
        yield Case(RAISED, entry.call, sample)
    named = [s for s in raised if dim_of(s, entry.dim_position) is not None]
    for sample in named[:_DIM_SAMPLES]:
        yield from _over_each_axis(entry, sample)
    bases = maps or raised
    if bases:  # the first with an operand of its input's shape, else the first
        yield from _mixed(entry, next((b for b in bases if _operands(b)), bases[0]))


def generic_cases(entry: OperatorEntry) -> Iterator[Case]:
    """The ``generic`` case of each of the first samples that take a tensor first: that tensor
    (each of a list given first) replaced by a ``GENERIC`` one of its dtype, the rest as given
    (a concatenation along dimension 1 of (5, 2, 1) and (5, 3, 1) tensors, which no raise
    keeps joinable)."""
    made = 0
    for sample in entry.samples():
        if made == _RAISED_TRIED:
            return
        if not _strided(first_tensor(sample.input)):
            continue
        made += 1
        if isinstance(sample.input, torch.Tensor):
            given: object = _generic(sample.input)
        else:
            given = type(sample.input)(
                _generic(v) if isinstance(v, torch.Tensor) else v for v in sample.input
            )
        yield Case(GENERIC_CASE, entry.call, Sample(given, sample.args, sample.kwargs))


def _generic(t: torch.Tensor) -> torch.Tensor:
    return torch.randn(GENERIC, device=t.device).to(t.dtype)


def _over_each_axis(entry: OperatorEntry, sample: Sample) -> Iterator[Case]:
    keepdims: tuple[bool | None, ...] = (False, True) if entry.keepdim else (None,)
    for (axis, name), keepdim in itertools.product(enumerate(_AXES), keepdims):
        args, kwargs = with_dim(sample.args, sample.kwargs, entry.dim_position, axis)
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
    first = first_tensor(base.input)
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
    first = first_tensor(sample.input)
    return [
        i for i, t in enumerate(flat(sample))
        if i > 0 and first is not None and isinstance(t, torch.Tensor) and t.shape == first.shape
    ]  # fmt: skip


def _replacing(index: int, make: Callable[[torch.Tensor], torch.Tensor]):
    """The first input channels_last and the operand at ``index`` made by ``make``."""

    def layout(i: int, t: torch.Tensor) -> torch.Tensor:
        if i == index:
            return make(t)
        return channels_last(t) if _is_map(t) else t

    return layout


def _case(
    call: Callable[..., Any],
    label: str,
    sample: Sample,
    layout: Callable[[int, torch.Tensor], torch.Tensor],
) -> Case:
    """``sample`` with each of its top-level tensors (numbered as ``_flat`` numbers them) laid
    out by ``layout``; others as they are."""
    values = iter(range(len(flat(sample))))

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
        first = first_tensor(x)
        assert first is not None
        return call(x, *args, out=first.new_empty(0), **kwargs)

    return with_out
