"""User-facing names of Python-level torch callables (``torch.cat``, ``F.interpolate``)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from cl_audit.compat.operators import aten_op_name, is_operator
from cl_audit.registry import on_change
from cl_audit.rule.conversions import is_copy_op

__all__ = ["is_copy", "python_op_name"]


@functools.cache
def _known_names() -> dict[int, str]:
    names: dict[int, str] = {}
    for prefix, namespace in (("torch", vars(torch)), ("F", vars(F))):
        for name, value in namespace.items():
            if callable(value):
                names.setdefault(id(value), f"{prefix}.{name}")
    for name in dir(torch.Tensor):
        names.setdefault(id(getattr(torch.Tensor, name)), f"Tensor.{name}")
    return names


def python_op_name(func: object) -> str:
    """Name a callable seen by a ``TorchFunctionMode`` as a user would write it."""
    if isinstance(func, str):
        return func
    known = _known_names().get(id(func))
    if known is not None:
        return known
    if is_operator(func):
        return f"torch.ops.{aten_op_name(func)}"  # a library's operator: torchvision.roi_align
    owner = getattr(func, "__self__", None)  # e.g. the __get__ of a Tensor property
    if owner is not None and getattr(func, "__name__", "") == "__get__":
        return f"Tensor.{getattr(owner, '__name__', '?')}"
    return getattr(func, "__qualname__", None) or repr(func)


@functools.cache
def is_copy(aten_op: object, python_op: object) -> bool:
    """Whether the operation is a pure copy (``rule.is_copy_op``), judged once per operator
    (and again after the operator registry changes)."""
    return is_copy_op(
        None if aten_op is None else aten_op_name(aten_op),
        None if python_op is None else python_op_name(python_op),
    )


on_change(is_copy.cache_clear)
