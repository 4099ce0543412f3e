"""The loss/regain rule, in one place: decided from strides, storage identity and provenance only.

- **Loss**: an operation returns a *new* tensor (its storage is none of its inputs') whose layout
  is contiguous and which carries an order (two or more dims of size > 1, broadcasts aside), from
  channels_last-ordered data: a channels_last input, or a view reading channels_last storage in
  another shape (a reshaped view, or a stacked copy of channels_last maps), when
  1. the output is 4D/5D (``softmax(dim=1)``, resnest's ``reshape(...).sum(1)``), or
  2. the operation is a copy (``clone``, ``_to_copy``, ``flatten``, ``reshape``...) and the output
     has as many elements as that input (the copy inside ``flatten``; a ``bmm`` never counts).
- **Regain**: a 4D/5D input is contiguous and a new output is channels_last.
- **Provenance**: parameter-derived data is the parameters and buffers, the outputs of operations
  whose tensor inputs are all parameter-derived, and constants (outputs of operations with no
  tensor input). A conversion is ``PARAMETER`` when every input it converts is; else ``BATCH``.
- **Round trips**: contiguous data carries the set of loss occurrences it derives from; a regain
  marks each not yet regained occurrence of its contiguous inputs as a round trip, once.
- **Regain source**: a regain's contiguous input comes from a recorded ``LOSS``, from another
  ``PRODUCER`` of contiguous 4D/5D data, or from ``OUTSIDE`` the audit (never produced in it).
"""

from __future__ import annotations

import torch

from cl_audit.enums import Provenance, RegainSource
from cl_audit.registry import OpClass, lookup
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = [
    "SPATIAL_RANKS",
    "carries_order",
    "is_copy_op",
    "is_loss",
    "is_regain",
    "provenance",
    "regain_source",
]

SPATIAL_RANKS = (4, 5)

_CONTIGUOUS = MemoryLayout.CONTIGUOUS


def is_copy_op(aten_name: str | None, python_name: str | None) -> bool:
    """A pure copy (``OpClass.COPY`` in the operator registry: its only work is to copy its
    input, maybe in another shape, dtype or device): judged by the aten name when there is one
    (dispatch engine), else by the Python-level name (patch engine: ``torch.flatten`` of a
    channels_last map is one call there, a clone plus a view at aten level)."""
    declared = lookup(aten_name if aten_name is not None else python_name or "")
    return declared is not None and OpClass.COPY in declared.classes


def carries_order(tensor: torch.Tensor) -> bool:
    """Two or more dims of size > 1 that are not stride-0 broadcasts: only then can the order of
    the dims in memory differ between formats."""
    ordered = 0
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        if size > 1 and stride != 0:
            ordered += 1
            if ordered == 2:
                return True
    return False


def is_loss(
    output: torch.Tensor,
    channels_last: list[torch.Tensor],
    reshaped: list[torch.Tensor],
    copy: bool,
) -> bool:
    """Whether a new ``output`` loses the format of the channels_last-ordered inputs.

    ``channels_last``: inputs classified channels_last; ``reshaped``: inputs reading channels_last
    storage in another shape; ``copy``: the operation is a pure copy (``is_copy_op``).
    """
    if layout_of(output) is not _CONTIGUOUS:
        return False
    if output.dim() in SPATIAL_RANKS:
        return bool(channels_last or reshaped) and carries_order(output)
    if not copy:
        return False
    # A same-size copy reorders whatever order its input had: judged on the input, so that
    # ``torch.flatten`` of a batch of one is a loss under both engines (at aten level the
    # copy is a 4D ``clone``).
    numel = output.numel()
    return any(t.numel() == numel and carries_order(t) for t in channels_last) or any(
        t.numel() == numel and carries_order(t) for t in reshaped
    )


def is_regain(output: torch.Tensor, contiguous: list[torch.Tensor]) -> bool:
    """A new channels_last ``output`` from contiguous 4D/5D inputs."""
    return bool(contiguous) and layout_of(output) is MemoryLayout.CHANNELS_LAST


def provenance(converted_from_parameters: bool) -> Provenance:
    return Provenance.PARAMETER if converted_from_parameters else Provenance.BATCH


def regain_source(from_loss: bool, from_producer: bool) -> RegainSource:
    """What made a regain's contiguous input: a loss first, then another producer, else the
    data was never produced inside the audit."""
    if from_loss:
        return RegainSource.LOSS
    if from_producer:
        return RegainSource.PRODUCER
    return RegainSource.OUTSIDE
