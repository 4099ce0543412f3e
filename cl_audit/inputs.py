"""A model's example inputs: positional and keyword arguments, as a factory or the Python API
gives them (a tensor, a tuple of arguments, or a dict of keyword arguments).

The 4D and 5D floating-point tensors among them are what a conversion converts (as
``Module.to`` converts the model); everything else (timesteps, token ids, masks, embeddings)
is passed as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Example", "example_of", "is_shape"]


@dataclass(frozen=True)
class Example:
    """Positional arguments ``args`` and keyword arguments ``kwargs`` of one call."""

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def tensors(self) -> Iterator[torch.Tensor]:
        """The tensors among the arguments, positional first."""
        for value in (*self.args, *self.kwargs.values()):
            if isinstance(value, torch.Tensor):
                yield value

    @property
    def first(self) -> torch.Tensor | None:
        """The first 4D/5D floating-point tensor (else the first tensor): the one a report
        names as the input."""
        tensors = list(self.tensors())
        spatial = [t for t in tensors if t.dim() in (4, 5) and t.is_floating_point()]
        return (spatial or tensors or [None])[0]

    def map(self, convert: Callable[[Any], Any]) -> Example:
        """Every argument through ``convert`` (which passes what it does not handle)."""
        return Example(
            tuple(convert(v) for v in self.args), {k: convert(v) for k, v in self.kwargs.items()}
        )

    def call(self, function: Callable[..., Any]) -> Any:
        return function(*self.args, **self.kwargs)


def is_shape(value: object) -> bool:
    """A per-sample input shape such as ``(3, 224, 224)``: a tuple or list of ints."""
    return (
        isinstance(value, (tuple, list))
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def example_of(value: object) -> Example:
    """A tensor is the one positional argument, a dict the keyword arguments, a tuple or list
    the positional arguments."""
    if isinstance(value, Example):
        return value
    if isinstance(value, torch.Tensor):
        return Example((value,))
    if isinstance(value, Mapping):
        return Example((), dict(value))
    if isinstance(value, (tuple, list)):
        return Example(tuple(value))
    raise TypeError(
        f"an example input is a tensor, a tuple of arguments or a dict of keyword arguments, "
        f"not {type(value).__name__}"
    )
