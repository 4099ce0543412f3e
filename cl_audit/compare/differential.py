"""The differential audit: terminal losses compared with the same forward run in NCHW.

A round trip thrashes whatever else is true. A terminal loss is different: nothing converts it
back, so the question is whether channels_last added it at all. The NCHW run watches only the
operations that could be counterparts of a terminal loss (same op and input shapes), records
where they ran (module path, call site) and their input and output strides, and each terminal
loss is then *neutral* when a counterpart at its place ran on the same strides (the conversion
changed nothing for this operation), *caused* when the counterparts ran on other strides (the
flatten before a classifier, a free view in NCHW), and *unaligned* when none ran there: counted
as caused, and listed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from cl_audit.compat.operators import aten_op_name
from cl_audit.enums import Differential, DifferentialStatus
from cl_audit.intercept.naming import python_op_name
from cl_audit.intercept.tracking import tensor_arguments
from cl_audit.report import DifferentialRun, Finding, TensorSummary
from cl_audit.rule.attribution import ModuleNames, locate

__all__ = ["CounterpartWatcher", "classify_terminal"]

_Strides = tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # (shape, strides) per tensor
_Place = tuple[str | None, str | None, str, tuple[tuple[int, ...], ...]]


def _op_key(python_op: str | None, aten_op: str | None) -> str:
    """Operations are aligned at the Python level where known: ``torch.flatten`` copies in
    channels_last (``aten.clone``) but is a view in NCHW (``aten.view``)."""
    return python_op or aten_op or "?"


def _layout(summaries: tuple[TensorSummary, ...]) -> _Strides:
    return tuple((t.shape, t.strides) for t in summaries)


class CounterpartWatcher:
    """The observer of the NCHW run: remembers the operations that match a terminal loss by
    op and input shapes, with their place and strides. Keeps metadata, never tensors."""

    def __init__(self, names: ModuleNames, terminal: tuple[Finding, ...]) -> None:
        self._names = names
        self._wanted: dict[str, set[tuple[tuple[int, ...], ...]]] = {}
        for finding in terminal:
            shapes = tuple(t.shape for t in finding.inputs)
            self._wanted.setdefault(_op_key(finding.python_op, finding.aten_op), set()).add(shapes)
        self._aten_names: dict[object, str] = {}
        self.seen: dict[_Place, set[tuple[str | None, _Strides, _Strides]]] = {}

    def observe(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None:
        python_name = None if python_op is None else python_op_name(python_op)
        aten_name = None
        if aten_op is not None:
            aten_name = self._aten_names.get(aten_op)
            if aten_name is None:
                aten_name = self._aten_names[aten_op] = aten_op_name(aten_op)
        key = _op_key(python_name, aten_name)
        wanted = self._wanted.get(key)
        if wanted is None:
            return
        inputs = tensor_arguments(args) + (tensor_arguments(kwargs.values()) if kwargs else [])
        shapes = tuple(tuple(t.shape) for t in inputs)
        if shapes not in wanted:
            return
        if isinstance(result, torch.Tensor):
            outputs = [result]
        else:
            outputs = tensor_arguments(result) if isinstance(result, (list, tuple)) else []
        location = locate(self._names)
        place = (location.module_path, location.call_site, key, shapes)
        layout_in = tuple((tuple(t.shape), tuple(t.stride())) for t in inputs)
        layout_out = tuple((tuple(t.shape), tuple(t.stride())) for t in outputs)
        self.seen.setdefault(place, set()).add((aten_name, layout_in, layout_out))


def _verdict(finding: Finding, watcher: CounterpartWatcher) -> Differential:
    key = _op_key(finding.python_op, finding.aten_op)
    shapes = tuple(t.shape for t in finding.inputs)
    counterparts = watcher.seen.get((finding.module_path, finding.call_site, key, shapes))
    if not counterparts:
        return Differential.UNALIGNED
    same = (finding.aten_op, _layout(finding.inputs), _layout(finding.outputs))
    return Differential.NEUTRAL if same in counterparts else Differential.CAUSED


def _part(finding: Finding, count: int, round_trips: int) -> Finding:
    """The share of a merged finding made of ``count`` of its identical occurrences."""
    per_event = finding.bytes_converted // finding.count
    return replace(
        finding,
        count=count,
        bytes_converted=per_event * count,
        round_trips=round_trips,
        terminal=count - round_trips,
    )


def classify_terminal(
    offenders: tuple[Finding, ...], watcher: CounterpartWatcher
) -> tuple[tuple[Finding, ...], tuple[Finding, ...], DifferentialRun]:
    """Sort each offender's terminal occurrences by their NCHW counterparts: (offenders,
    format-neutral losses, the run's status). Neutral ones leave the offenders; round trips
    always stay."""
    kept: list[Finding] = []
    neutral: list[Finding] = []
    unaligned = 0
    for finding in offenders:
        if not finding.terminal:
            kept.append(finding)
            continue
        verdict = _verdict(finding, watcher)
        if verdict is Differential.NEUTRAL:
            if finding.round_trips:
                kept.append(_part(finding, finding.round_trips, finding.round_trips))
            terminal = _part(finding, finding.terminal, 0)
            neutral.append(replace(terminal, differential=verdict))
            continue
        unaligned += finding.terminal if verdict is Differential.UNALIGNED else 0
        kept.append(replace(finding, differential=verdict))
    order = lambda f: (-f.bytes_converted, -f.count)  # noqa: E731
    kept.sort(key=order)
    neutral.sort(key=order)
    return tuple(kept), tuple(neutral), DifferentialRun(DifferentialStatus.RAN, None, unaligned)
