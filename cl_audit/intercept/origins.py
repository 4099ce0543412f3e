"""Where NCHW-ordered data came from, and what it cost: the origins the recorder tracks of
contiguous 4D/5D data (its producer, the writer of its order, the losses it derives from), and
the losses and regains recorded against them (``Tallies``). The recorder holds one ``Origins``
and calls its steps only where contiguous data appeared or is tracked."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cl_audit.compat.storage import storage_key as _storage_key
from cl_audit.enums import Conversion, Phase
from cl_audit.intercept.tracking import (
    Occurrence,
    Origin,
    Tallies,
    merge_origins,
    nbytes,
    producer_of,
)
from cl_audit.report import Finding
from cl_audit.rule.attribution import Location
from cl_audit.rule.conversions import SPATIAL_RANKS, provenance, regain_source
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = ["Origins"]

_CL = MemoryLayout.CHANNELS_LAST
_CONTIGUOUS = MemoryLayout.CONTIGUOUS
_SPATIAL_RANKS = SPATIAL_RANKS


def _writes_order(
    output: torch.Tensor, inputs: list[torch.Tensor], contiguous: list[torch.Tensor]
) -> bool:
    """Whether an operation chose the memory order of its new ``output`` rather than keeping
    its input's: it did unless it read a contiguous map of the output's rank (a convolution,
    pool or pointwise operation in NCHW keeps that order) or an input of the output's shape
    and strides (a pointwise operation on tokens)."""
    rank = output.dim()
    if any(t.dim() == rank for t in contiguous):
        return False
    shape, strides = output.shape, output.stride()
    return not any(t.shape == shape and t.stride() == strides for t in inputs)


class Origins:
    """The origins of tracked contiguous data, by storage (``by_storage``), and the findings
    recorded against them (``tallies``). ``locate`` says where the running operation belongs;
    ``parameters`` is the recorder's set of parameter-derived storages, read here."""

    def __init__(self, locate: Callable[[], Location], parameters: set[int]) -> None:
        self.by_storage: dict[int, Origin] = {}  # storage -> origin of its contiguous data
        self.tallies = Tallies()
        self._locate = locate
        self._parameters = parameters

    def read(self, inputs: list[torch.Tensor], in_keys: list[int]) -> list[Origin]:
        """The origins of the tracked contiguous data among the inputs, each once, first first;
        an input read as channels_last is not contiguous data."""
        origins = self.by_storage
        found: list[Origin] = []
        for tensor, key in zip(inputs, in_keys, strict=True):
            origin = origins.get(key)
            if (
                origin is not None
                and all(origin is not f for f in found)
                and layout_of(tensor) is not _CL
            ):
                found.append(origin)
        return found

    def carry(
        self,
        aten_op: object,
        python_op: object,
        inputs: list[torch.Tensor],
        contiguous: list[torch.Tensor],
        found: list[Origin],
        new: list[tuple[torch.Tensor, int]],
    ) -> None:
        """Data derived from tracked data: its new outputs, unless channels_last, carry on the
        origins it read, merged. An output whose order this operation chose (``_writes_order``)
        names it as the writer, the fix site of what converts the data later."""
        origin = merge_origins(found)
        origins = self.by_storage
        written: Origin | None = None
        for t, key in new:
            if layout_of(t) is _CL:
                continue
            if _writes_order(t, inputs, contiguous):
                if written is None:
                    producer = producer_of(aten_op, python_op, self._locate())
                    written = Origin(origin.producer, origin.occurrences, origin.view, producer)
                origins[key] = written
            else:
                origins[key] = origin

    def start(
        self,
        aten_op: object,
        python_op: object,
        outputs: list[torch.Tensor],
        out_keys: list[int],
        new: list[tuple[torch.Tensor, int]],
        sources: list[torch.Tensor],
    ) -> None:
        """Track contiguous 4D/5D data that appears from untracked data, this operation its
        producer: a new tensor, or a view giving data that was not contiguous 4D/5D (tokens,
        windows) that shape. A view of channels_last data (a map permuted to NHWC, as
        LayerNorm2d does) is the channels_last order itself, never NCHW-ordered data: no
        producer, so no root cause or fix site is a permute."""
        new_keys = {key for _, key in new}
        spatial_contiguous = [
            key
            for t, key in zip(outputs, out_keys, strict=True)
            if t.dim() in _SPATIAL_RANKS
            and layout_of(t) is _CONTIGUOUS
            and t.numel()
            and (key in new_keys or not sources)
        ]
        if not spatial_contiguous:
            return
        view = not any(key in new_keys for key in spatial_contiguous)
        origin = Origin(producer_of(aten_op, python_op, self._locate()), (), view)
        for key in spatial_contiguous:
            self.by_storage[key] = origin

    def _origins_of(self, tensors: list[torch.Tensor]) -> list[Origin]:
        found: list[Origin] = []
        for tensor in tensors:
            origin = self.by_storage.get(_storage_key(tensor))
            if origin is not None and all(origin is not f for f in found):
                found.append(origin)
        return found

    def record_loss(
        self,
        phase: Phase,
        call: int,
        aten_op: object,
        python_op: object,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        lost: list[tuple[torch.Tensor, int]],
        sources: list[torch.Tensor],
        reshaped: list[torch.Tensor],
        contiguous: list[torch.Tensor],
        found: list[Origin],
    ) -> None:
        location = self._locate()
        producer = producer_of(aten_op, python_op, location)
        mixed = bool(sources and contiguous)
        root = next(iter(self._origins_of(contiguous)), None) if mixed else None
        tally = self.tallies.of(
            phase,
            Conversion.LOSS,
            producer,
            inputs,
            outputs,
            mixed,
            None if root is None else root.producer,
            provenance(all(_storage_key(t) in self._parameters for t in sources + reshaped)),
            None,
        )
        tally.count += 1
        tally.calls.append(call)
        tally.bytes_converted += nbytes([t for t, _ in lost])
        # Downstream, the contiguous data still traces back to the root cause, if there is one,
        # and derives from this occurrence and from the losses its inputs derive from.
        occurrences = merge_origins([Origin(producer, (Occurrence(tally),)), *found]).occurrences
        if root is None:
            origin = Origin(producer, occurrences)
        else:  # the NCHW input's writer is the fix
            origin = Origin(root.producer, occurrences, root.view, root.writer)
        for _, key in lost:
            self.by_storage[key] = origin

    def record_regain(
        self,
        phase: Phase,
        call: int,
        aten_op: object,
        python_op: object,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        regained: list[torch.Tensor],
        contiguous: list[torch.Tensor],
    ) -> None:
        location = self._locate()
        producer = producer_of(aten_op, python_op, location)
        found = self._origins_of(contiguous)
        from_loss = next((o for o in found if o.occurrences), None)
        cause = from_loss or (found[0] if found else None)
        tally = self.tallies.of(
            phase,
            Conversion.REGAIN,
            producer,
            inputs,
            outputs,
            False,
            None if cause is None else cause.producer,
            provenance(all(_storage_key(t) in self._parameters for t in contiguous)),
            regain_source(from_loss is not None, cause is not None),
        )
        tally.count += 1
        tally.calls.append(call)
        tally.bytes_converted += nbytes(regained)
        for origin in found:
            for occurrence in origin.occurrences:
                if not occurrence.regained:
                    occurrence.regained = True
                    occurrence.tally.round_trips += 1

    def findings(
        self, call_times: dict[int, float] | None = None
    ) -> tuple[list[Finding], list[Finding]]:
        """(losses, regains), most bytes first; losses of either provenance. ``call_times``
        (milliseconds by call number, the ``call`` each was recorded with) gives each finding
        the time of its calls."""
        return self.tallies.findings(call_times)
