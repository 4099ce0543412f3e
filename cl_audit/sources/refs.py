"""A model by reference: what names it (``ModelRef``), what is built (``LoadedModel``), how it is
built (``BuildOptions``, ``building``), and the helpers every source shares."""

from __future__ import annotations

import contextlib
import difflib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn

from cl_audit.enums import ModelSource
from cl_audit.errors import UsageError
from cl_audit.execution.inputs import Example

__all__ = [
    "BuildOptions",
    "LoadedModel",
    "ModelRef",
    "cap_input",
    "close_matches",
    "library",
    "positional_source",
]


def library(name: str) -> ModuleType:
    """Import a model library (``torchvision.models``, ``timm``); one that cannot load beside
    this torch (a torchvision built for another release) is a one-line ``UsageError``."""
    try:
        return importlib.import_module(name)
    except Exception as e:
        top = name.partition(".")[0]
        cause = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(
            f"{top} cannot be imported beside torch {torch.__version__} "
            f"({type(e).__name__}: {cause}); install the {top} release built for this torch"
        ) from e


def positional_source(spec: str) -> ModelSource:
    """A positional model spec: ``module:factory`` / ``file.py:factory`` (it holds a colon) is
    the user's, anything else a torchvision name."""
    return ModelSource.USER if ":" in spec else ModelSource.TORCHVISION


@dataclass(frozen=True, order=True)
class ModelRef:
    """A model to audit; for ``ModelSource.USER`` the name is the spec."""

    source: ModelSource
    name: str

    @property
    def key(self) -> str:
        return f"{self.source.value}:{self.name}"


@dataclass(frozen=True)
class LoadedModel:
    """A built model (random weights) and its per-sample input shape, e.g. ``(3, 224, 224)``."""

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]
    capped: bool = False  # input_shape is smaller than the model's own, by BuildOptions
    declared: bool = False  # input_shape is the user's own, audited as declared
    loss: Callable[[Any], torch.Tensor] | None = None  # a factory's own training loss
    example: Example | None = None  # a factory's own inputs: input_shape is then theirs
    # a registry model's arguments made of the random batch of input_shape (and whether the
    # step trains), where it takes more than that batch: an image pair, a list of images
    arguments: Callable[[torch.Tensor, bool], Example] | None = None


@dataclass(frozen=True)
class BuildOptions:
    """``max_input_size`` caps the spatial sides of a registry model's default input (models
    with a fixed input size are built smaller where they allow it; a user factory's declared
    shape is never capped); ``input_size`` is the per-sample shape the model will be given
    (``--input-size``: a model with a fixed input size is built for its sides where it allows,
    as for a cap); ``meta`` builds without allocating weights;
    ``skip_random_init`` zero-fills instead of drawing random weights (see ``building``)."""

    max_input_size: int | None = None
    input_size: tuple[int, ...] | None = None
    meta: bool = False
    skip_random_init: bool = False


def close_matches(name: str, candidates: list[str]) -> str:
    """' (did you mean: a, b?)' or ''."""
    matches = difflib.get_close_matches(name, candidates, n=4, cutoff=0.6)
    return f" (did you mean: {', '.join(matches)}?)" if matches else ""


def cap_input(shape: tuple[int, ...], max_side: int | None) -> tuple[int, ...]:
    """Clamp the spatial sides (the last two dims) of a per-sample shape to ``max_side``."""
    if max_side is None:
        return shape
    return (*shape[:-2], *(min(side, max_side) for side in shape[-2:]))


_RANDOM_FILLS = ("uniform_", "normal_")


@contextlib.contextmanager
def _zero_filled_init() -> Iterator[None]:
    """``Tensor.uniform_`` and ``normal_``, behind ``nn.init`` and timm's ``trunc_normal_``,
    zero-fill instead while a model is built: layouts do not depend on weight values, and
    drawing random numbers dominates build time (measured 1.4-13x faster builds). Zeros rather
    than skipped writes: uninitialised memory can hold NaNs and slow denormals. Restored by
    identity on exit, also after an exception."""
    saved = {name: vars(torch.Tensor).get(name) for name in _RANDOM_FILLS}
    try:
        for name in _RANDOM_FILLS:
            setattr(torch.Tensor, name, lambda self, *args, **kwargs: self.zero_())
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def building(options: BuildOptions) -> Iterator[None]:
    """Where model constructors run: on the meta device, or with zero-filled init, if asked."""
    with contextlib.ExitStack() as stack:
        if options.meta:
            stack.enter_context(torch.device("meta"))
        elif options.skip_random_init:
            stack.enter_context(_zero_filled_init())
        yield
