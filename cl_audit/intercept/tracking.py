"""The recorder's bookkeeping records: tallies of findings, loss occurrences, and the origin of a
run of contiguous data (where it began, and the losses it derives from); with the helpers that
read tensors on the hot path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cl_audit.layout import layout_of
from cl_audit.report import Producer, TensorSummary

__all__ = [
    "Occurrence",
    "Origin",
    "Tally",
    "merge_origins",
    "nbytes",
    "summary_of",
    "tensor_arguments",
]

_Tensor = torch.Tensor
_SEQUENCES = (list, tuple)
_SCALARS = (int, float, bool)


@dataclass
class Tally:
    count: int = 0
    bytes_converted: int = 0
    round_trips: int = 0
    calls: list[int] = field(default_factory=list)  # call numbers, for the time attribution


class Occurrence:
    """One execution of a loss; a regain of data derived from it makes it a round trip, once."""

    __slots__ = ("regained", "tally")

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.regained = False


@dataclass(eq=False)
class Origin:
    """Where a run of contiguous data began (a loss or another producer; with a root cause, the
    loss's root cause), and the loss occurrences the data derives from."""

    producer: Producer
    occurrences: tuple[Occurrence, ...]
    view: bool = False  # the producer is a view (tokens viewed as a map): no fix site


def tensor_arguments(values: Any) -> list[torch.Tensor]:
    """Tensors among ``values``, also inside lists and tuples (``cat``); on the hot path."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, _Tensor):
            found.append(value)
        elif type(value) in _SEQUENCES and value and not isinstance(value[0], _SCALARS):
            found.extend(v for v in value if isinstance(v, _Tensor))
    return found


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def summary_of(tensor: torch.Tensor) -> TensorSummary:
    return TensorSummary(
        shape=tuple(tensor.shape),
        strides=tuple(tensor.stride()),
        dtype=str(tensor.dtype).removeprefix("torch."),
        device=str(tensor.device),
        layout=layout_of(tensor),
    )


def merge_origins(origins: list[Origin]) -> Origin:
    """One origin for data derived from several: the union of their loss occurrences, led by the
    first that has any (so a loss-sourced regain names a loss)."""
    if len(origins) == 1:
        return origins[0]
    occurrences: dict[int, Occurrence] = {}
    for origin in origins:
        for occurrence in origin.occurrences:
            occurrences.setdefault(id(occurrence), occurrence)
    lead = next((o for o in origins if o.occurrences), origins[0])
    return Origin(lead.producer, tuple(occurrences.values()), lead.view)
