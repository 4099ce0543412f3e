"""The recorder's bookkeeping records: tallies of findings, loss occurrences, and the origin of a
run of contiguous data (where it began, and the losses it derives from); with the helpers that
read tensors on the hot path."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from cl_audit.compat.operators import aten_op_name
from cl_audit.enums import Conversion, Phase, Provenance, RegainSource
from cl_audit.intercept.naming import python_op_name
from cl_audit.report import Finding, Producer, TensorSummary
from cl_audit.report.environment import dtype_name
from cl_audit.rule.attribution import Location
from cl_audit.rule.layout import layout_of

__all__ = [
    "Occurrence",
    "Origin",
    "Tallies",
    "Tally",
    "merge_origins",
    "nbytes",
    "producer_of",
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
    loss's root cause), the loss occurrences the data derives from, and the operation that last
    wrote its order (``writer``, None: the producer), the fix site of a site converting it."""

    producer: Producer
    occurrences: tuple[Occurrence, ...]
    view: bool = False  # the producer is a view (tokens viewed as a map): no fix site
    writer: Producer | None = None

    @cached_property
    def cause(self) -> tuple[Producer, Producer | None] | None:
        """(fix site, root cause) of what converts data of this origin: the writer of its
        order, and where the run began; a view producer is neither (None: no cause). Read on
        every operation that reads the data, so made once."""
        root = None if self.view else self.producer
        fix = self.writer or root
        return None if fix is None else (fix, root)


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
        dtype=dtype_name(tensor.dtype),
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
    return Origin(lead.producer, tuple(occurrences.values()), lead.view, lead.writer)


class Tallies:
    """The findings so far, one tally per distinct kind, producer, tensors, root cause,
    provenance, regain source and phase."""

    def __init__(self) -> None:
        self._tallies: dict[tuple, Tally] = {}

    def of(
        self,
        phase: Phase,
        kind: Conversion,
        producer: Producer,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        mixed: bool,
        root_cause: Producer | None,
        provenance: Provenance,
        source: RegainSource | None,
    ) -> Tally:
        """The tally of this finding, new or counted before."""
        key = (
            kind,
            producer,
            tuple(summary_of(t) for t in inputs),
            tuple(summary_of(t) for t in outputs),
            mixed,
            root_cause,
            provenance,
            source,
            phase,
        )
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally()
        return tally

    def findings(
        self, call_times: dict[int, float] | None = None
    ) -> tuple[list[Finding], list[Finding]]:
        """(losses, regains), most bytes first (see ``Recorder.findings``)."""
        losses: list[Finding] = []
        regains: list[Finding] = []
        for key, tally in self._tallies.items():
            kind, producer, inputs, outputs, mixed, root, origin, source, phase = key
            is_loss = kind is Conversion.LOSS
            finding = Finding(
                kind=kind,
                python_op=producer.python_op,
                aten_op=producer.aten_op,
                module_path=producer.module_path,
                module_class=producer.module_class,
                call_site=producer.call_site,
                inputs=inputs,
                outputs=outputs,
                count=tally.count,
                bytes_converted=tally.bytes_converted,
                round_trips=tally.round_trips if is_loss else 0,
                terminal=tally.count - tally.round_trips if is_loss else 0,
                mixed_formats=mixed,
                root_cause=root,
                provenance=origin,
                regain_source=source,
                phase=phase,
                time_ms=None
                if call_times is None
                else sum(call_times.get(call, 0.0) for call in tally.calls),
            )
            (losses if is_loss else regains).append(finding)
        order = lambda f: (-f.bytes_converted, -f.count)  # noqa: E731
        return sorted(losses, key=order), sorted(regains, key=order)


def producer_of(aten_op: object, python_op: object, location: Location) -> Producer:
    """The operation that made some data, named and placed as reports name it."""
    return Producer(
        python_op=None if python_op is None else python_op_name(python_op),
        aten_op=None if aten_op is None else aten_op_name(aten_op),
        module_path=location.module_path,
        module_class=location.module_class,
        call_site=location.call_site,
    )
