"""A first-order backward run node by node from Python: how ``--train --fake`` differentiates.

Torch's autograd engine needs the device for a CUDA backward (it asks for the device's streams),
even when the tensors are fake; the autograd graph itself does not: every node can be called
from Python, and runs its backward formula on fake tensors of any device. ``run_backward`` calls
them as torch's engine does for ``loss.backward()`` (``Engine::execute``, no ``create_graph``):

- a node runs once every gradient it waits for has arrived, the highest sequence number first
  (torch's ready queue: AccumulateGrad before all others), with grad mode off;
- each gradient is fitted to the node it flows to (``validate_outputs``): summed to its input's
  shape where it was broadcast, cast to its dtype, moved to its device;
- gradients for the same input add up out of place (``InputBuffer::accumulate`` for tensor
  subclasses, which fake tensors are);
- AccumulateGrad keeps a gradient as the parameter's ``.grad`` where it obeys the gradient layout
  contract and no other input holds it, and otherwise copies it to the parameter's strides
  (``accumulateGrad``, ``clone_obey_contract``); a leaf's tensor hooks run first, its
  post-accumulate hooks after;
- a custom autograd Function runs its ``backward`` (``apply``), with missing gradients made
  zeros, and the gradients it returns for tensor inputs kept;
- an intermediate tensor's hooks (``Tensor.register_hook`` under ``recording_hooks``) run on its
  gradient before its node;
- the engine's own operations (the first gradient, the fitting, the adding, a custom Function's
  zeros) run in C++ in torch's engine, where no torch function mode sees them: here too they
  run without one (a dispatch mode sees them in both); hooks and a custom Function's backward
  are the model's code, and see them.

Not run: hooks registered on autograd nodes themselves; a module's backward hooks (their
node, ``BackwardHookFunctionBackward``, is refused by name) and a reentrant backward inside a
node (``torch.utils.checkpoint``'s reentrant variant: torch's engine again) fail naming the
node. ``backward_problem`` probes a torch for what this needs.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge

from cl_audit.compat.autograd import (
    backward_hooks,
    input_metadata,
    is_custom_function,
    missing_node_methods,
    sequence_nr,
)
from cl_audit.compat.modes import without_torch_function
from cl_audit.errors import UsageError
from cl_audit.rule.layout import is_dense

__all__ = ["backward_problem", "recording_hooks", "run_backward"]

Node = Any  # torch.autograd.graph.Node: its Python binding, whose private members are used here
_Hooks = dict[Node, list[tuple[int, dict[Any, Callable[..., Any]]]]]

_REFUSED = {  # nodes whose work happens outside their backward formula
    "BackwardHookFunctionBackward": "a module backward hook (register_full_backward_hook)",
}


@contextmanager
def recording_hooks() -> Iterator[_Hooks]:
    """While the forward runs: the hooks registered on its intermediate tensors, for
    ``run_backward``. ``Tensor.register_hook`` is wrapped meanwhile and restored on exit: each
    call on a tensor that has a node notes the node, the output it hooks and the tensor's hook
    dict (hooks added later land in the same dict). A wrapper costs nothing on the forward's
    other calls, where a torch function mode hearing every call cost 1.6% of a fake training
    audit (40 timm models)."""
    hooks: _Hooks = {}
    register = torch.Tensor.register_hook

    @functools.wraps(register)
    def recorded(tensor: torch.Tensor, hook: Callable[..., Any]) -> Any:
        handle = register(tensor, hook)
        with without_torch_function():
            node = tensor.grad_fn
            if node is not None:
                entry = (tensor.output_nr, backward_hooks(tensor))
                found = hooks.setdefault(node, [])
                # once per dict: a torch function mode (the audit's) hands the call back here
                # from inside ``register``, and hooks added later land in the same dict
                if all(e[1] is not entry[1] for e in found):
                    found.append(entry)
        return handle

    torch.Tensor.register_hook = recorded  # type: ignore[method-assign]
    try:
        yield hooks
    finally:
        torch.Tensor.register_hook = register  # type: ignore[method-assign]


def run_backward(
    root: torch.Tensor,
    running: Callable[[Node | None], None] = lambda node: None,
    hooks: _Hooks | None = None,
    gradient: torch.Tensor | None = None,
) -> None:
    """``root.backward(gradient)`` (ones for a scalar ``root``), node by node (module
    docstring); ``running`` hears each node before it runs (its call, the fitting and adding of
    what it returns) and None after; ``hooks`` are those ``recording_hooks`` found."""
    with without_torch_function():
        if not root.requires_grad:
            raise RuntimeError("the tensor differentiated does not require grad")
        first, slot = get_gradient_edge(root)[:2]  # a leaf's: its AccumulateGrad
        start = torch.ones_like(root) if gradient is None else gradient
    waiting = _dependencies(first)
    buffers: dict[Node, list[torch.Tensor | None]] = {first: [None] * len(input_metadata(first))}
    buffers[first][slot] = start
    holders: dict[int, int] = {id(start): 1}
    order = itertools.count()
    ready = [(-sequence_nr(first), next(order), first)]
    with torch.no_grad():
        while ready:
            node = heapq.heappop(ready)[2]
            grads = buffers.pop(node, None) or [None] * len(input_metadata(node))
            for grad in grads:
                if grad is not None:
                    holders[id(grad)] -= 1
            running(node)
            try:
                for output, hooked in (hooks or {}).get(node, ()):
                    grads[output] = _hooked(grads[output], hooked)
                outputs = _call(node, grads, holders)
                del grads
                for (successor, slot), grad in zip(node.next_functions, outputs, strict=False):
                    if successor is None:
                        continue
                    if grad is not None:
                        grad = _fitted(grad, input_metadata(successor)[slot])
                        _add(buffers, holders, successor, slot, grad)
                    waiting[successor] -= 1
                    if not waiting[successor]:
                        heapq.heappush(ready, (-sequence_nr(successor), next(order), successor))
            finally:
                running(None)


def _dependencies(first: Node) -> dict[Node, int]:
    """How many edges lead into each node reachable from ``first``."""
    waiting: dict[Node, int] = {}
    stack, seen = [first], {first}
    while stack:
        for successor, _ in stack.pop().next_functions:
            if successor is None:
                continue
            waiting[successor] = waiting.get(successor, 0) + 1
            if successor not in seen:
                seen.add(successor)
                stack.append(successor)
    return waiting


def _add(
    buffers: dict[Node, list[torch.Tensor | None]],
    holders: dict[int, int],
    node: Node,
    slot: int,
    grad: torch.Tensor,
) -> None:
    buffer = buffers.setdefault(node, [None] * len(input_metadata(node)))
    held = buffer[slot]
    if held is not None:
        holders[id(held)] -= 1
        with without_torch_function():
            grad = held + grad
    buffer[slot] = grad
    holders[id(grad)] = holders.get(id(grad), 0) + 1


def _fitted(grad: torch.Tensor, metadata: Any) -> torch.Tensor:
    """``validate_outputs``: the gradient summed to the input's shape, in its dtype and on
    its device."""
    with without_torch_function():
        if tuple(grad.shape) != tuple(metadata.shape):
            grad = grad.sum_to_size(metadata.shape)
        if grad.dtype != metadata.dtype:
            grad = grad.to(metadata.dtype)
        if grad.device != metadata.device:
            grad = grad.to(metadata.device)
        return grad


def _hooked(grad: torch.Tensor | None, hooks: dict[Any, Callable[..., Any]] | None) -> Any:
    if grad is None:
        return None
    for hook in list((hooks or {}).values()):
        result = hook(grad)
        grad = grad if result is None else result
    return grad


def _call(node: Node, grads: list[torch.Tensor | None], holders: dict[int, int]) -> tuple:
    name = node.name()
    if name in _REFUSED:
        raise UsageError(
            f"{name}: {_REFUSED[name]}, which cl-audit's node-by-node backward does not run; "
            "audit the model where its device is, or without --fake"
        )
    variable = getattr(node, "variable", None)
    if variable is not None:  # AccumulateGrad
        with without_torch_function():
            hooks = backward_hooks(variable)
        _accumulate(variable, _hooked(grads[0], hooks), holders)
        return ()
    if is_custom_function(node):
        return _custom(node, grads)
    outputs = node(*grads)
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _accumulate(variable: torch.Tensor, grad: torch.Tensor | None, holders: dict[int, int]):
    """AccumulateGrad's first-order path (``accumulateGrad`` in accumulate_grad.h)."""
    if grad is None:
        return
    with without_torch_function():  # torch's own bookkeeping: no function mode sees it
        if variable.grad is None:
            if not holders.get(id(grad)) and _obeys_layout_contract(grad, variable):
                variable.grad = grad.detach()
            elif is_dense(variable.shape, variable.stride()):
                copy = variable.new_empty_strided(variable.shape, variable.stride())
                variable.grad = copy.copy_(grad)
            else:
                variable.grad = grad.clone(memory_format=torch.contiguous_format)
        else:
            variable.grad += grad
        hooks = getattr(variable, "_post_accumulate_grad_hooks", None) or {}
    for hook in list(hooks.values()):
        hook(variable)


def _obeys_layout_contract(grad: torch.Tensor, variable: torch.Tensor) -> bool:
    """``utils::obeys_layout_contract``: strides equal where the size is not 1 (and no zero
    stride where it is), or contiguous for a parameter that is not dense."""
    if not is_dense(variable.shape, variable.stride()):
        return grad.is_contiguous()
    for size, stride, wanted in zip(grad.shape, grad.stride(), variable.stride(), strict=True):
        if (size != 1 and stride != wanted) or (size == 1 and stride == 0):
            return False
    return True


def _custom(node: Any, grads: list[torch.Tensor | None]) -> tuple:
    """A custom Function's backward (``PyNode::apply``): missing gradients made zeros (its
    ``materialize_grads`` cannot be read back: a Function that turned it off gets zeros too),
    one gradient returned per forward argument, those of tensors that require grad passed on
    in the order of their edges."""
    with without_torch_function():
        grads = [
            torch.zeros(m.shape, dtype=m.dtype, device=m.device) if g is None else g
            for g, m in zip(grads, input_metadata(node), strict=True)
        ]
    results = node.apply(*grads)
    results = results if isinstance(results, tuple) else (results,)
    kept = iter(r for r, needed in zip(results, node.needs_input_grad, strict=False) if needed)
    return tuple(None if s is None else next(kept, None) for s, _ in node.next_functions)


@functools.cache
def backward_problem() -> str | None:
    """Why this torch cannot run a backward node by node, or None: a probe differentiates a
    convolution and a sum with both engines on fake CPU tensors, which must agree."""
    from cl_audit.fake.mode import new_fake_mode

    def grads(engine: Callable[[torch.Tensor], None]) -> list[tuple[int, ...]]:
        with new_fake_mode():
            x = torch.empty(2, 3, 6, 6).to(memory_format=torch.channels_last)
            w = torch.empty(4, 3, 3, 3).to(memory_format=torch.channels_last).requires_grad_()
            b = torch.empty(4, requires_grad=True)
            engine(torch.nn.functional.conv2d(x, w, b).sum())
            return [w.grad.stride(), b.grad.stride()]

    lacking = missing_node_methods()
    if lacking:
        needs = "which a backward run node by node needs"
        return f"torch {torch.__version__} lacks {', '.join(lacking)}, {needs}"
    try:
        if grads(run_backward) == grads(lambda loss: loss.backward()):
            return None
        found = "gradients laid out unlike torch's engine's"
    except Exception as e:
        found = f"{type(e).__name__}: {e}"
    return f"torch {torch.__version__} cannot run a backward node by node ({found})"[:300]
