"""Nests of tuples, lists and dicts (a model's inputs and outputs), through torch's pytree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["flatten", "map_tensors", "tensor_leaves", "unflatten"]


def map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """``value`` (a nest of tuples, lists and dicts) with each tensor replaced by ``fn(it)``."""
    return torch.utils._pytree.tree_map(
        lambda v: fn(v) if isinstance(v, torch.Tensor) else v, value
    )


def flatten(value: Any) -> tuple[list[Any], Any]:
    """The leaves of a nest of tuples, lists and dicts, and its structure (``unflatten``)."""
    return torch.utils._pytree.tree_flatten(value)


def unflatten(leaves: list[Any], structure: Any) -> Any:
    """The nest ``flatten`` took apart, with ``leaves`` in its places."""
    return torch.utils._pytree.tree_unflatten(leaves, structure)


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors in a nest of tuples, lists and dicts (a model's output)."""
    return [a for a in torch.utils._pytree.tree_leaves(value) if isinstance(a, torch.Tensor)]
