"""The operator coverage index as a report (``cl-audit ops``): each operator's behaviour on
channels_last input, from its samples, and the index of one torch release, device and dtype,
with its JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cl_audit.enums import OpBehaviour
from cl_audit.report.codec import decode, encode
from cl_audit.report.envelope import (
    OPS_FORMAT,
    OPS_READABLE,
    OPS_VERSION,
    read_envelope,
)

__all__ = ["WORST", "CaseRow", "OperatorRow", "OpsIndex", "SampleResult", "Unjudged"]


WORST = tuple(OpBehaviour)  # the enum's order: worst first


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
class CaseRow:
    """The samples of one case of an operator (``features.ops_index.cases``: ``samples``,
    ``raised``, ``dim=C``, ``channels_last + NCHW``, ...): their worst behaviour, how many
    behaved each way, and the example. In a mixed case the behaviour says which layout the
    output took: ``keeps`` channels_last, ``loses`` NCHW."""

    case: str
    behaviour: OpBehaviour
    counts: tuple[tuple[OpBehaviour, int], ...]
    example: SampleResult
    mixed: bool = False  # a mixed-layout case


@dataclass(frozen=True)
class OperatorRow:
    """An operator: its worst behaviour over its database and raised samples (mixed layouts
    apart), how many behaved each way, and the example (the first sample of the worst
    behaviour); each case's own; ``error`` when its samples could not be made."""

    op: str
    behaviour: OpBehaviour | None
    counts: tuple[tuple[OpBehaviour, int], ...]
    example: SampleResult | None
    error: str | None = None
    aten_ops: tuple[str, ...] = ()  # what made its samples' outputs: how sweeps' sites join it
    gradient: OpBehaviour | None = None  # the worst of its samples' input gradients
    gradient_counts: tuple[tuple[OpBehaviour, int], ...] = ()
    cases: tuple[CaseRow, ...] = ()

    def case(self, label: str) -> CaseRow | None:
        return next((c for c in self.cases if c.case == label), None)


@dataclass(frozen=True)
class Unjudged:
    """An operator of the database with no row: why none of its samples could be judged."""

    op: str
    reason: str


@dataclass(frozen=True)
class OpsIndex:
    """The index of one torch release, device and dtype; ``without_map``: how many operators
    have no row, ``unjudged`` each with its reason (none in version 3 and earlier, which
    counted them only); ``predicted``: run on fake tensors of a device this machine lacks (no
    kernel ran); ``gradients_not_judged``: why no row has a gradient, when none was judged."""

    torch: str
    device: str
    dtype: str
    rows: tuple[OperatorRow, ...]
    without_map: int
    seconds: float
    predicted: bool = False
    gradients_not_judged: str | None = None
    unjudged: tuple[Unjudged, ...] = ()

    def count(self, behaviour: OpBehaviour) -> int:
        return sum(row.behaviour is behaviour for row in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"format": OPS_FORMAT, "version": OPS_VERSION, **encode(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpsIndex:
        return read_envelope(data, OPS_FORMAT, OPS_READABLE, lambda _: decode(cls, data))
