"""make_fx and the graph it is building: how a training step is traced into an aten graph for
replay (``cl_audit.replay``), each behind a feature test."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx

from cl_audit.compat import TorchDispatchMode, _missing

try:
    from torch.fx.experimental import proxy_tensor as _proxy
except ImportError:  # pragma: no cover - every supported torch has it
    _proxy = None  # type: ignore[assignment]

__all__ = [
    "building_graph",
    "graph_on_device",
    "new_nodes",
    "node_note",
    "note_node",
    "replay_problem",
    "trace_graph",
]

_make_fx = getattr(_proxy, "make_fx", None)
# torch 2.4 names it get_innermost_proxy_mode
_get_proxy_mode = getattr(_proxy, "get_proxy_mode", None) or getattr(
    _proxy, "get_innermost_proxy_mode", None
)


@functools.cache
def replay_problem() -> str | None:
    """Why this torch cannot trace a step for replay (``--train --fake``), or None: a probe
    traces a random draw with a generator and an operation, and finds, from a mode above the
    trace, the graph it is building."""
    for name, found in (("make_fx", _make_fx), ("get_proxy_mode", _get_proxy_mode)):
        if found is None:
            return f"torch {torch.__version__} lacks proxy_tensor.{name}, which a replay needs"

    class _Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            result = func(*args, **(kwargs or {}))
            building_graph()
            return result

    def probe(x: torch.Tensor) -> torch.Tensor:
        with _Probe():  # random labels, as a training loss draws them (torch 2.4: refused)
            labels = torch.randint(2, (2,), generator=torch.Generator().manual_seed(0))
            return x + labels

    try:
        trace_graph(probe, [torch.ones(2)])
    except Exception as e:
        return (
            f"torch {torch.__version__} cannot trace a training step for replay "
            f"({type(e).__name__}: {e})"[:300]
        )
    return None


def trace_graph(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> fx.GraphModule:
    """``fn(*inputs)`` traced into an aten graph: its inputs are the graph's placeholders (the
    tensors ``fn`` reaches that are not among them become its constants)."""
    if _make_fx is None:
        raise _missing("proxy_tensor.make_fx", "a replayed training step")
    return _make_fx(fn, tracing_mode="real")(*inputs)


def building_graph() -> fx.Graph:
    """The graph that the trace in progress is adding nodes to."""
    mode = None if _get_proxy_mode is None else _get_proxy_mode()
    if mode is None:
        raise _missing("proxy_tensor.get_proxy_mode", "a replayed training step")
    return mode.tracer.graph


def new_nodes(graph: fx.Graph, last: fx.Node | None) -> Iterator[fx.Node]:
    """The nodes added after ``last`` (all of them for None), newest first."""
    for node in reversed(graph.nodes):
        if node is last:
            return
        yield node


_NOTE = "cl_audit.note"  # the key of cl-audit's note in a node's metadata


def note_node(node: fx.Node, note: object) -> None:
    """Leave ``note`` on a graph node (fx keeps it in the node's metadata)."""
    node.meta[_NOTE] = note


def node_note(node: fx.Node) -> Any:
    """The note left on ``node``, or None."""
    return node.meta.get(_NOTE)


def graph_on_device(graph: fx.GraphModule, device: torch.device) -> fx.GraphModule:
    """The graph with every device its nodes name moved to ``device`` (a cast's, a factory's);
    tensor constants stay where they are: trace with every tensor a placeholder."""

    def move(value: Any) -> Any:
        if isinstance(value, torch.device):
            return device
        if isinstance(value, (list, tuple)):
            return type(value)(move(v) for v in value)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    for node in graph.graph.nodes:
        if node.op == "call_function":
            node.args, node.kwargs = move(node.args), move(node.kwargs)
    graph.recompile()
    return graph
