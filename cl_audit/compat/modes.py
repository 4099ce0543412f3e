"""Torch function modes: off for cl-audit's own bookkeeping (``without_torch_function``), all
modes off (``outside_modes``), and a function mode whose work another of cl-audit's can do
in its place (``FunctionLayer``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "FunctionLayer",
    "TorchDispatchMode",
    "function_layer_taken",
    "outside_modes",
    "without_torch_function",
]


# Torch function modes and subclasses off, for what cl-audit does that is no call of the
# model's: its reads of tensors' metadata, the operator a dispatch handler passes on, the
# node-by-node backward's bookkeeping. Each would pass every function mode active (cl-audit's
# own too, tens of thousands of calls an audit: reports/pages/overhead.md). The class itself,
# no wrapper: the dispatch observer enters it on every operation.
without_torch_function = torch._C.DisableTorchFunction


def outside_modes() -> contextlib.AbstractContextManager[object]:
    """No dispatch mode (fake or other) active inside: tensors made there are what they say."""
    return torch.utils._python_dispatch._disable_current_modes()


class FunctionLayer(TorchFunctionMode):
    """A torch function mode of cl-audit's whose work (``handle``: one call, passed on by
    calling it) another function mode of cl-audit's can do as a part of its own
    (``function_layer_taken``): a mode's hop less a call (1.7% of a fake CUDA training audit,
    40 timm models). Alone, it is a mode as any."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.handle(func, args, kwargs or {})

    def handle(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError


@contextlib.contextmanager
def function_layer_taken() -> Iterator[FunctionLayer | None]:
    """The innermost torch function mode where it is a ``FunctionLayer``, off the mode stack
    while inside (the caller does its work: a function mode it pushes now takes its place in
    the order) and back on it on exit; else None, the stack left as it is."""
    stack = torch.overrides._get_current_function_mode_stack()
    if not stack or not isinstance(stack[-1], FunctionLayer):
        yield None
        return
    layer = torch.overrides._pop_mode()
    try:
        yield layer
    finally:
        torch.overrides._push_mode(layer)
