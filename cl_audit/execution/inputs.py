"""A model's example inputs: positional and keyword arguments, as a factory or the Python API
gives them (a tensor, a tuple of arguments, or a dict of keyword arguments).

The 4D and 5D floating-point tensors among them are what a conversion converts (as
``Module.to`` converts the model); everything else (timesteps, token ids, masks, embeddings)
is passed as given. Arguments nest in lists, tuples and dicts (a detection model's images and
targets); a list of equally shaped 3-D floating-point images is the batch it stacks to (a
conversion to channels_last lays each image out as a slice of a channels_last batch, as
``list(batch)`` of a channels_last batch gives them).
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
        """The first 4D/5D floating-point tensor, a list of images as a view of the batch's
        shape (else the first tensor): the one a report names as the input (its shape, dtype
        and device), whose first dimension is the batch."""
        tensors = [t for v in (*self.args, *self.kwargs.values()) for t in _leaves(v)]
        spatial = [t for t in tensors if t.dim() in (4, 5) and t.is_floating_point()]
        return (spatial or tensors or [None])[0]

    def map(self, convert: Callable[[Any], Any]) -> Example:
        """Every argument through ``convert`` (which passes what it does not handle), into
        lists, tuples and dicts; a list of images as the batch it stacks to, unbound after."""
        return Example(
            tuple(_mapped(v, convert) for v in self.args),
            {k: _mapped(v, convert) for k, v in self.kwargs.items()},
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


def _images(value: list[Any] | tuple[Any, ...]) -> bool:
    """A list of equally shaped 3-D floating-point images (a detection model's input)."""
    return bool(value) and all(
        isinstance(v, torch.Tensor) and v.dim() == 3 and v.is_floating_point()
        and v.shape == value[0].shape
        for v in value
    )  # fmt: skip


def _mapped(value: Any, convert: Callable[[Any], Any]) -> Any:
    if isinstance(value, (list, tuple)) and _images(value):
        return type(value)(convert(torch.stack(value)).unbind(0))
    if isinstance(value, (list, tuple)):
        return type(value)(_mapped(v, convert) for v in value)
    if isinstance(value, dict):
        return {k: _mapped(v, convert) for k, v in value.items()}
    return convert(value)


def _leaves(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)) and _images(value):
        yield value[0].expand(len(value), *value[0].shape)  # the batch's shape, not a copy
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
