"""The input gradient an operator of the index hands back for a channels_last output gradient,
on real tensors or on fake tensors of a device this machine lacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cl_audit.compat.pytree import map_tensors, tensor_leaves
from cl_audit.enums import OpBehaviour
from cl_audit.fake.backward import run_backward
from cl_audit.features.ops_index.cases import channels_last
from cl_audit.features.ops_index.target import Target
from cl_audit.rule.layout import MemoryLayout, layout_of

__all__ = ["first_map", "input_gradient"]


def first_map(value: object) -> torch.Tensor | None:
    """The first 4-D or 5-D tensor among ``value``'s leaves."""
    return next((t for t in tensor_leaves(value) if t.dim() in (4, 5)), None)


def input_gradient(call: Callable[..., Any], target: Target, x: Any, args: Any, kwargs: Any):
    """The first input's gradient's behaviour and strides (``gradient``, ``gradient_strides``)
    for a channels_last gradient of the output, as a channels_last model's backward hands it
    over; nothing where none flows (no backward for these arguments, an operator judged in an
    integer dtype). On a predicted device, the backward runs node by node on the target's fake
    tensors with its kernel-source overrides (``cl_audit.fake.backward``, as ``--train
    --fake`` predicts one), the gradient taken as it reaches the input (a hook), before
    ``.grad`` would lay it out as the input."""
    x, args, kwargs = map_tensors(target.place, (x, args, kwargs))
    first = next(iter(tensor_leaves(x)))
    if not (first.is_floating_point() or first.is_complex()):
        return {}
    leaf = first.detach().requires_grad_(True)
    given = map_tensors(lambda t: leaf if t is first else t, x)
    reached: list[torch.Tensor] = []
    try:
        with target.context(), torch.enable_grad():
            out = first_map(call(given, *args, **kwargs))
            if out is None or not out.requires_grad:
                return {}
            grad_out = channels_last(torch.ones_like(out, memory_format=torch.contiguous_format))
            if target.predicted:  # autograd's engine needs the device: node by node
                leaf.register_hook(reached.append)
                run_backward(out, gradient=grad_out)
            else:
                reached.extend(torch.autograd.grad(out, leaf, grad_out, allow_unused=True))
    except Exception:  # no backward for these arguments: the gradient is not judged
        return {}
    grad = reached[0] if reached else None
    if grad is None:
        return {}
    behaviour = {
        MemoryLayout.CHANNELS_LAST: OpBehaviour.KEEPS,
        MemoryLayout.CONTIGUOUS: OpBehaviour.LOSES,
        MemoryLayout.AMBIGUOUS: OpBehaviour.AMBIGUOUS,
    }.get(layout_of(grad), OpBehaviour.OTHER)
    return {"gradient": behaviour, "gradient_strides": grad.stride()}
