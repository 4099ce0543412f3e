"""The checker shared by both engines: applies the loss/regain rule and keeps summaries.

An engine calls ``Recorder.observe`` once per intercepted operation, after it ran. The recorder
keeps counts and tensor metadata, never tensors: storages are tracked by identity only, to link a
loss to the regain that undoes it and a mixed-format operation to the producer of its
contiguous input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cl_audit.attribution import Location, ModuleNames, locate
from cl_audit.intercept.naming import aten_op_name, python_op_name
from cl_audit.layout import MemoryLayout, layout_of
from cl_audit.report import Conversion, Finding, Producer, Summary, TensorSummary

__all__ = ["Recorder"]

_CL = MemoryLayout.CHANNELS_LAST
_CONTIGUOUS = MemoryLayout.CONTIGUOUS
_OTHER = MemoryLayout.OTHER
_SPATIAL_RANKS = (4, 5)
_Tensor = torch.Tensor
_SEQUENCES = (list, tuple)
_SCALARS = (int, float, bool)


@dataclass
class _Tally:
    count: int = 0
    bytes_converted: int = 0
    round_trips: int = 0


@dataclass
class _Origin:
    """Where a run of contiguous data began; ``loss`` is set when that was a conversion."""

    producer: Producer
    loss: _Tally | None
    regained: bool = False


def _tensors(values: Any) -> list[torch.Tensor]:
    """Tensors among ``values``, also inside lists and tuples (``cat``); on the hot path."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, _Tensor):
            found.append(value)
        elif type(value) in _SEQUENCES and value and not isinstance(value[0], _SCALARS):
            found.extend(v for v in value if isinstance(v, _Tensor))
    return found


def _storage_key(tensor: torch.Tensor) -> int:
    """Identity of the storage (its StorageImpl address): also works for fake tensors."""
    return tensor.untyped_storage()._cdata


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _summary(tensor: torch.Tensor) -> TensorSummary:
    return TensorSummary(
        shape=tuple(tensor.shape),
        strides=tuple(tensor.stride()),
        dtype=str(tensor.dtype).removeprefix("torch."),
        device=str(tensor.device),
        layout=layout_of(tensor),
    )


class Recorder:
    """Applies the rule to each operation and accumulates findings."""

    def __init__(self, names: ModuleNames) -> None:
        self._names = names
        self.calls_checked = 0
        self.first_spatial: tuple[str, str] | None = (
            None  # (device, dtype) of the first 4D/5D input
        )
        self._ops_seen: set[object] = set()
        self._tallies: dict[tuple, _Tally] = {}
        self._origins: dict[int, _Origin] = {}  # storage address -> origin of its contiguous data

    def observe(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None:
        """Check one finished operation. ``python_op`` is a callable or a name, or None."""
        self.calls_checked += 1
        self._ops_seen.add(aten_op if aten_op is not None else python_op)
        inputs = _tensors(args)
        if kwargs:
            inputs.extend(_tensors(kwargs.values()))
        if isinstance(result, _Tensor):
            outputs = [result]
        elif type(result) in _SEQUENCES:
            outputs = _tensors(result)
        else:
            return

        sources: list[torch.Tensor] = []  # channels_last-ordered inputs
        reshaped: list[torch.Tensor] = []  # views reading channels_last storage in another order
        contiguous: list[torch.Tensor] = []  # contiguous-ordered 4D/5D inputs
        for tensor in inputs:
            layout = layout_of(tensor)
            if layout is _CL:
                sources.append(tensor)
            elif layout is _CONTIGUOUS:
                if tensor.dim() in _SPATIAL_RANKS:
                    contiguous.append(tensor)
            elif layout is _OTHER:
                base = tensor._base
                if base is not None and layout_of(base) is _CL:
                    reshaped.append(tensor)
        if self.first_spatial is None and (sources or contiguous):
            first = (sources or contiguous)[0]
            self.first_spatial = (str(first.device), str(first.dtype).removeprefix("torch."))

        interesting = bool(self._origins)
        for tensor in outputs:
            layout = layout_of(tensor)
            if layout is _CONTIGUOUS:
                interesting |= bool(sources or reshaped) or tensor.dim() in _SPATIAL_RANKS
            elif layout is _CL:
                interesting |= bool(contiguous)
        if not interesting:
            return  # the common case: nothing contiguous appeared and nothing is being tracked
        input_keys = {_storage_key(t) for t in inputs}
        new_keys = {}  # id(output) -> storage key, for outputs that own a new storage
        for tensor in outputs:
            key = _storage_key(tensor)
            if tensor.numel() and key not in input_keys:
                new_keys[id(tensor)] = key
                self._origins.pop(key, None)  # a storage identity reused: forget its past
        new_outputs = [t for t in outputs if id(t) in new_keys]

        lost = [t for t in new_outputs if _is_loss(t, sources, reshaped)]
        if lost:
            self._record_loss(aten_op, python_op, inputs, outputs, lost, sources, contiguous)
            return
        regained = [t for t in new_outputs if layout_of(t) is _CL]
        if contiguous and regained:
            self._record_regain(aten_op, python_op, inputs, outputs, regained, contiguous)
            return
        # Contiguous 4D/5D data appears: a new tensor, or a view that gives non-spatial data
        # (tokens, windows) its NCHW shape again.
        from_flat = not any(t.dim() in _SPATIAL_RANKS for t in inputs)
        spatial_contiguous = [
            t
            for t in outputs
            if t.dim() in _SPATIAL_RANKS
            and layout_of(t) is _CONTIGUOUS
            and t.numel()
            and (from_flat or id(t) in new_keys)
        ]
        if not spatial_contiguous:
            return
        origin = self._origin_of(inputs) if self._origins else None
        if origin is None:
            if contiguous:
                return  # contiguous data from outside the audit (input, parameter) stays untracked
            location = locate(self._names)
            origin = _Origin(self._producer(aten_op, python_op, location), loss=None)
        for tensor in spatial_contiguous:
            self._origins[_storage_key(tensor)] = origin

    def _origin_of(self, tensors: list[torch.Tensor]) -> _Origin | None:
        for tensor in tensors:
            origin = self._origins.get(_storage_key(tensor))
            if origin is not None:
                return origin
        return None

    def _producer(self, aten_op: object, python_op: object, location: Location) -> Producer:
        return Producer(
            python_op=None if python_op is None else python_op_name(python_op),
            aten_op=None if aten_op is None else aten_op_name(aten_op),
            module_path=location.module_path,
            module_class=location.module_class,
            call_site=location.call_site,
        )

    def _tally(
        self,
        kind: Conversion,
        producer: Producer,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        mixed: bool,
        root_cause: Producer | None,
    ) -> _Tally:
        key = (
            kind,
            producer,
            tuple(_summary(t) for t in inputs),
            tuple(_summary(t) for t in outputs),
            mixed,
            root_cause,
        )
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = _Tally()
        return tally

    def _record_loss(
        self,
        aten_op: object,
        python_op: object,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        lost: list[torch.Tensor],
        sources: list[torch.Tensor],
        contiguous: list[torch.Tensor],
    ) -> None:
        location = locate(self._names)
        producer = self._producer(aten_op, python_op, location)
        mixed = bool(sources and contiguous)
        root = self._origin_of(contiguous) if mixed else None
        tally = self._tally(
            Conversion.LOSS,
            producer,
            inputs,
            outputs,
            mixed,
            None if root is None else root.producer,
        )
        tally.count += 1
        tally.bytes_converted += _nbytes(lost)
        # Downstream, the contiguous data still traces back to the root cause, if there is one.
        origin = _Origin(producer if root is None else root.producer, loss=tally)
        for tensor in lost:
            self._origins[_storage_key(tensor)] = origin

    def _record_regain(
        self,
        aten_op: object,
        python_op: object,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
        regained: list[torch.Tensor],
        contiguous: list[torch.Tensor],
    ) -> None:
        location = locate(self._names)
        producer = self._producer(aten_op, python_op, location)
        tally = self._tally(Conversion.REGAIN, producer, inputs, outputs, False, None)
        tally.count += 1
        tally.bytes_converted += _nbytes(regained)
        for tensor in contiguous:
            origin = self._origins.get(_storage_key(tensor))
            if origin is not None and origin.loss is not None and not origin.regained:
                origin.regained = True
                origin.loss.round_trips += 1

    def findings(self) -> tuple[list[Finding], list[Finding]]:
        """(losses, regains), most bytes first."""
        losses: list[Finding] = []
        regains: list[Finding] = []
        for (kind, producer, inputs, outputs, mixed, root), tally in self._tallies.items():
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
            )
            (losses if is_loss else regains).append(finding)
        order = lambda f: (-f.bytes_converted, -f.count)  # noqa: E731
        return sorted(losses, key=order), sorted(regains, key=order)

    def summary(self, losses: list[Finding], regains: list[Finding]) -> Summary:
        op_names = {
            aten_op_name(op) if hasattr(op, "overloadpacket") else python_op_name(op)
            for op in self._ops_seen
            if op is not None
        }
        return Summary(
            calls_checked=self.calls_checked,
            distinct_ops=len(op_names),
            offending_ops=len({f.aten_op or f.python_op for f in losses}),
            losses=sum(f.count for f in losses),
            regains=sum(f.count for f in regains),
            round_trips=sum(f.round_trips for f in losses),
            terminal_conversions=sum(f.terminal for f in losses),
            bytes_converted=sum(f.bytes_converted for f in losses + regains),
        )


def _is_loss(
    output: torch.Tensor, sources: list[torch.Tensor], reshaped: list[torch.Tensor]
) -> bool:
    """A new contiguous-ordered output from channels_last data.

    From a channels_last-ordered input: a 4D/5D output, or a same-size copy of any rank (the copy
    inside ``flatten``). From a reshaped view of channels_last storage: a same-size copy.
    """
    if layout_of(output) is not _CONTIGUOUS:
        return False
    if sources and output.dim() in _SPATIAL_RANKS:
        return True
    numel = output.numel()
    return any(t.numel() == numel for t in sources) or any(t.numel() == numel for t in reshaped)
