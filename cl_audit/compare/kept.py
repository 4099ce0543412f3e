"""What-if changes of the conversion, not of a line: a tensor of the model that the conversion
restrided to channels_last, and that no convolution took as its weight, kept as it was (NCHW
strides) while a what-if run runs (``cl_audit.phases.verify``)."""

from __future__ import annotations

from itertools import chain

import torch
from torch import nn

from cl_audit.rule.conversions import SPATIAL_RANKS
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = ["KEPT_TRIED", "Kept", "kept_advice", "nearest", "restrided"]

KEPT_TRIED = 2  # the restrided tensors tried per site, each kept alone


def restrided(model: nn.Module, weights: frozenset[str]) -> tuple[str, ...]:
    """The names of the model's 4-D/5-D parameters and buffers in channels_last strides that
    no convolution of the audited run took as its weight (``weights``), largest first."""
    found = [
        (name, tensor.numel())
        for name, tensor in chain(model.named_parameters(), model.named_buffers())
        if tensor.dim() in SPATIAL_RANKS
        and name not in weights
        and layout_of(tensor) is MemoryLayout.CHANNELS_LAST
    ]
    found.sort(key=lambda pair: -pair[1])
    return tuple(name for name, _ in found)


def nearest(candidates: tuple[str, ...], module_path: str | None) -> tuple[str, ...]:
    """The ``KEPT_TRIED`` candidates nearest a site in ``module_path``: those its module or an
    enclosing module holds, the innermost first (a block's own position table); else the
    largest (a table the root holds and hands down)."""
    path = module_path or ""

    def owner(name: str) -> str:
        return name.rpartition(".")[0]

    def encloses(module: str) -> bool:
        return not module or path == module or path.startswith(module + ".")

    held = [n for n in candidates if encloses(owner(n))]
    held.sort(key=lambda n: -len(owner(n)))
    return tuple((held or list(candidates))[:KEPT_TRIED])


def kept_advice(name: str) -> str:
    """The edit a user makes to keep the model's tensor ``name`` as it was."""
    return (
        f"keep {name} as it was (NCHW strides): convert only the convolution weights "
        f"(torch.nn.utils.convert_conv2d_weight_memory_format(model, torch.channels_last)), or "
        f"after model.to(memory_format=torch.channels_last) give it back its strides, "
        f"model.{name}.data = model.{name}.data.contiguous()"
    )


class Kept:
    """The model's tensor ``name`` (found by name on entry: a conversion replaces buffers)
    given NCHW strides inside, its data as it was after; ``applied``: 1 once made."""

    def __init__(self, model: nn.Module, name: str) -> None:
        self._model, self._name = model, name
        self._tensor: torch.Tensor | None = None
        self._saved: torch.Tensor | None = None
        self.applied = 0
        self.named: str | None = None  # a change of a tensor names none beyond it

    def __enter__(self) -> Kept:
        module_path, _, attribute = self._name.rpartition(".")
        module = self._model.get_submodule(module_path)
        tensor = getattr(module, attribute)
        self._tensor, self._saved = tensor, tensor.data
        tensor.data = tensor.data.contiguous()
        self.applied = 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._tensor is not None and self._saved is not None:
            self._tensor.data = self._saved
