"""The torch internals of ``--compile``: Dynamo's capture of the graphs Inductor would be
given, Inductor's layout decision and its config switches, and the copies its lowering inserts.

Part of the compat package, the one place torch internals are touched; ``torch._inductor`` is
imported only by the functions that use it, and ``compile_problem`` names what a torch lacks
before ``--compile`` uses any of it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import re
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl_audit.compat.compile_run import recompile_room
from cl_audit.compat.fake_base import FakeTensor, FakeTensorMode

__all__ = [
    "CapturedGraph",
    "GraphConv",
    "GraphCopy",
    "backward_convolutions_decide",
    "capture_graphs",
    "compile_problem",
    "graph_convolutions",
    "graph_nodes",
    "layout_decision",
    "layout_optimization_enabled",
    "layout_optimization_forced",
    "lowered_copies",
]


@dataclass(frozen=True)
class GraphConv:
    """A convolution node of a captured FX graph, as Inductor's layout heuristic reads it:
    ``weight`` is ``(out, in / groups, *kernel)``; ``output`` the forward's output shape (for a
    ``convolution_backward`` node, its incoming gradient's); ``frames`` the user-code stack
    (``(file, line)``, outermost first); ``module`` the innermost ``(qualified name, class)``."""

    backward: bool
    weight: tuple[int, ...]
    groups: int
    output: tuple[int, ...]
    frames: tuple[tuple[str, int], ...]
    module: tuple[str, str] | None


@functools.cache
def compile_problem() -> str | None:
    """What this torch lacks for ``--compile`` (Dynamo, AOTAutograd, Inductor's layout
    decision, its config switches and lowering, and a capture of fake tensors: a probe traces
    and lowers one convolution), or None."""
    try:
        from torch._inductor import compile_fx, config, ir
        from torch._inductor.graph import GraphLowering
        from torch._inductor.virtualized import V
    except ImportError as e:
        return f"torch {torch.__version__} cannot import what --compile needs ({e})"
    missing = [
        name
        for owner, name in (
            (GraphLowering, "decide_layout_opt"),
            (config, "layout_optimization"),
            (config, "force_layout_optimization"),
            (compile_fx, "_recursive_post_grad_passes"),
            (compile_fx, "_recursive_record_original_output_strides"),
            (ir.ExternKernel, "require_strides"),
            (ir.ExternKernel, "copy_input"),
            (V, "set_extern_kernel_nodes"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        names = ", ".join(missing)
        return f"torch {torch.__version__} lacks Inductor's {names}, which --compile uses"
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # torch's own: the capture is torch's
    x = FakeTensor(mode, torch.empty(1, 4, 4, 4, device="meta"), torch.device("cpu"))
    w = FakeTensor(mode, torch.empty(4, 4, 1, 1, device="meta"), torch.device("cpu"))
    try:
        for graph in capture_graphs(lambda: F.conv2d(x, w)):
            lowered_copies(graph, layout_opt=True)
    except Exception as e:  # the probe's answer: the reason is given to the user
        lines = [line for line in str(e).splitlines() if line.strip()][:2]
        cause = " ".join(lines)[:200] if lines else type(e).__name__
        return (
            f"torch {torch.__version__} cannot capture and lower a compiled graph of fake "
            f"tensors, which --compile does ({cause}); see docs/torch-versions.md for the "
            "releases that can"
        )
    return None


@dataclass(frozen=True)
class CapturedGraph:
    """A graph as Inductor would lower it (after its decompositions, partitioner and post-grad
    passes): ``phase`` is ``inference``, ``forward`` or ``backward``; ``inputs`` its example
    inputs (fake tensors)."""

    phase: str
    gm: torch.fx.GraphModule
    inputs: tuple[object, ...]


def capture_graphs(
    fn: Callable[[], object], after: Callable[[object], None] | None = None
) -> list[CapturedGraph]:
    """The FX graphs Inductor would be given for ``fn()`` (then ``after(result)``, a backward),
    in capture order. Dynamo hands each graph to Inductor's own ``compile_fx`` (its
    decompositions, AOTAutograd's partitioner), whose inner compiler is replaced: it applies
    Inductor's post-grad passes, keeps the graph and runs it as traced, so nothing is
    code-generated or compiled. ``fn`` is compiled from a fresh code object: neither the user's
    compiled functions nor an earlier capture share its cache entries."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import (
        _recursive_post_grad_passes,
        _recursive_record_original_output_strides,
        compile_fx,
    )
    from torch._inductor.virtualized import V

    graphs: list[CapturedGraph] = []

    def inner(gm: torch.fx.GraphModule, example_inputs: list[object], **kw: object) -> object:
        inference, backward = bool(kw.get("is_inference")), bool(kw.get("is_backward"))
        run = make_boxed_func(gm.forward)  # the graph as traced, before the passes below
        _recursive_record_original_output_strides(gm)
        with V.set_fake_mode(_graph_fake_mode(example_inputs)):
            _recursive_post_grad_passes(gm, is_inference=inference)
        phase = "inference" if inference else "backward" if backward else "forward"
        graphs.append(CapturedGraph(phase, gm, tuple(example_inputs)))
        return run

    def backend(gm: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        return compile_fx(gm, example_inputs, inner_compile=inner)

    code = fn.__code__.replace(co_name=f"cl_audit_capture_{next(_captures)}")
    fresh = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    with recompile_room():  # a forward's resumed frames share code with earlier captures'
        result = torch.compile(fresh, backend=backend, dynamic=False)()
        if after is not None:
            after(result)  # the backward graph is compiled here
    return graphs


def _graph_fake_mode(example_inputs: list[object]) -> FakeTensorMode:
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(example_inputs)
    if mode is None:
        raise RuntimeError("a captured graph's example inputs carry no fake mode")
    return mode


@dataclass(frozen=True)
class GraphCopy:
    """A layout-changing copy Inductor's lowering inserts: a realized buffer (``producer``'s
    output, or a graph input) handed to ``consumer`` (the node being lowered: an operation, or
    the graph's output), which requires other strides. Frames and modules as in
    ``GraphConv``."""

    producer: str | None
    producer_frames: tuple[tuple[str, int], ...]
    producer_module: tuple[str, str] | None
    consumer: str
    consumer_frames: tuple[tuple[str, int], ...]
    consumer_module: tuple[str, str] | None
    shape: tuple[int, ...]
    source_strides: tuple[int, ...]
    strides: tuple[int, ...]
    bytes: int


def lowered_copies(graph: CapturedGraph, layout_opt: bool) -> tuple[GraphCopy, ...]:
    """Lower ``graph`` with Inductor's ``GraphLowering`` (``layout_opt`` as given, not as it
    would decide: a prediction for another device lowers with that device's decision) and
    return the copies its lowering inserts to change a realized buffer's strides
    (``ExternKernel.require_strides`` calling ``copy_input``; a copy that only realizes a fused
    computation in the wanted layout is not one). Lowering generates no code."""
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    copies: list[GraphCopy] = []
    calls: list[int] = [0]
    kernel = ir.ExternKernel
    saved = {name: kernel.__dict__[name] for name in ("require_strides", "copy_input")}
    require_strides = saved["require_strides"].__func__  # the classmethod's function
    copy_input = saved["copy_input"].__func__  # the staticmethod's

    def counted_copy(x: object) -> object:
        calls[0] += 1
        return copy_input(x)

    depth: list[int] = [0]

    def recorded(cls: type, x: object, *args: object, **kwargs: object) -> object:
        if depth[0]:  # a nested call (through a view): its copy is the outer call's
            return require_strides(cls, x, *args, **kwargs)
        source = _realized_strides(ir, x)
        before = calls[0]
        depth[0] += 1
        try:
            result = require_strides(cls, x, *args, **kwargs)
        finally:
            depth[0] -= 1
        if source is not None and calls[0] > before:
            copies.append(_copy(V.graph.current_node, _origin(ir, x), x, source, result))
        return result

    mode = _graph_fake_mode(list(graph.inputs))
    lowering = GraphLowering(
        graph.gm,
        example_inputs=list(graph.inputs),
        shape_env=mode.shape_env,
        layout_opt=layout_opt,
        is_inference=graph.phase == "inference",
        is_backward=graph.phase == "backward",
    )
    kernel.require_strides = classmethod(recorded)  # type: ignore[method-assign,assignment]
    kernel.copy_input = staticmethod(counted_copy)  # type: ignore[method-assign,assignment]
    try:
        with V.set_fake_mode(mode), V.set_graph_handler(lowering), V.set_extern_kernel_nodes([]):
            lowering.run(*graph.inputs)
    finally:
        for name, descriptor in saved.items():
            setattr(kernel, name, descriptor)
    return tuple(copies)


def _realized_strides(ir: types.ModuleType, x: object) -> tuple[int, ...] | None:
    """The strides of ``x`` when it is a realized buffer with fixed strides, or a view of a
    realized buffer, which a change of layout must copy; None for a computation not yet laid
    out (its copy is the computation itself, written in the wanted layout)."""
    if ir.is_storage_and_layout(x):
        layout = x.get_layout()  # type: ignore[union-attr]
        if isinstance(layout, ir.FlexibleLayout):
            return None
        return tuple(int(s) for s in layout.stride)
    view = getattr(x, "data", None)
    if not isinstance(view, ir.BaseView):
        return None
    try:
        base = view.unwrap_view()
    except NotImplementedError:
        return None
    if not ir.is_storage_and_layout(base):
        return None
    try:
        return tuple(int(s) for s in x.get_stride())  # type: ignore[union-attr]
    except (AttributeError, NotImplementedError):
        return tuple(int(s) for s in base.get_layout().stride)


def _origin(ir: types.ModuleType, x: object) -> torch.fx.Node | None:
    """The FX node that made the buffer under ``x`` (through views); None for a graph input."""
    base = x
    with contextlib.suppress(NotImplementedError, AttributeError):
        base = x.data.unwrap_view() if isinstance(x.data, ir.BaseView) else x  # type: ignore[union-attr]
    for candidate in (x, base):
        node = candidate.get_origin_node() if hasattr(candidate, "get_origin_node") else None
        if node is not None and node.op == "call_function":
            return node
    origins = [n for n in getattr(base, "origins", ()) if n.op == "call_function"]
    if not origins:
        return None
    position = {n: i for i, n in enumerate(origins[0].graph.nodes)}
    return max(origins, key=position.__getitem__)  # the last of them in the graph


def _copy(
    node: torch.fx.Node,
    origin: torch.fx.Node | None,
    x: object,
    source: tuple[int, ...],
    result: object,
) -> GraphCopy:
    shape = tuple(int(s) for s in x.get_size())  # type: ignore[union-attr]
    itemsize = x.get_dtype().itemsize  # type: ignore[union-attr]
    return GraphCopy(
        producer=None if origin is None else str(origin.target),
        producer_frames=() if origin is None else _frames(origin),
        producer_module=None if origin is None else _module(origin),
        consumer=str(node.target),
        consumer_frames=_frames(node),
        consumer_module=_module(node),
        shape=shape,
        source_strides=source,
        strides=tuple(int(s) for s in result.get_stride()),  # type: ignore[union-attr]
        bytes=math.prod(shape) * itemsize,
    )


def _frames(node: torch.fx.Node) -> tuple[tuple[str, int], ...]:
    """A node's user-code stack, ``(file, line)`` outermost first."""
    return tuple((f, int(n)) for f, n in _FRAME.findall(node.meta.get("stack_trace") or ""))


def _module(node: torch.fx.Node) -> tuple[str, str] | None:
    """A node's innermost module: ``(qualified name, class name)``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    qualified, cls = list(stack.values())[-1]
    return str(qualified), cls if isinstance(cls, str) else cls.__name__


_captures = itertools.count()
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def graph_nodes(gm: torch.fx.GraphModule) -> int:
    return len(gm.graph.nodes)


def graph_convolutions(gm: torch.fx.GraphModule) -> tuple[GraphConv, ...]:
    """Every ``aten.convolution`` and ``aten.convolution_backward`` node of ``gm``."""
    convs = []
    for node in gm.graph.nodes:
        args = node.args
        if node.target is torch.ops.aten.convolution.default:
            weight, groups, output = args[1].meta["val"], args[-1], node.meta["val"]
        elif node.target is torch.ops.aten.convolution_backward.default:
            weight, groups, output = args[2].meta["val"], args[9], args[0].meta["val"]
        else:
            continue
        convs.append(
            GraphConv(
                backward=node.target is torch.ops.aten.convolution_backward.default,
                weight=tuple(weight.shape),
                groups=int(groups),
                output=tuple(output.shape),
                frames=_frames(node),
                module=_module(node),
            )
        )
    return tuple(convs)


def layout_optimization_enabled() -> bool:
    from torch._inductor import config

    return bool(config.layout_optimization)


def layout_optimization_forced() -> bool:
    """Inductor's force switch (``TORCHINDUCTOR_FORCE_LAYOUT_OPT=1`` sets it)."""
    from torch._inductor import config

    return bool(config.force_layout_optimization)


def layout_decision(
    gm: torch.fx.GraphModule, *, inference: bool, generic: bool, force: bool = False
) -> bool:
    """Inductor's own layout decision for ``gm`` (``GraphLowering.decide_layout_opt``);
    ``generic`` decides as for a device without mkldnn's always-on CPU branch (a GPU), ``force``
    with Inductor's ``force_layout_optimization`` switch."""
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering

    with config.patch(force_layout_optimization=force):
        if not generic:
            return bool(GraphLowering.decide_layout_opt(gm, is_inference=inference))
        with _mkldnn(enabled=False):
            return bool(GraphLowering.decide_layout_opt(gm, is_inference=inference))


@contextlib.contextmanager
def _mkldnn(enabled: bool) -> Iterator[None]:
    """mkldnn switched on or off, without its flags' warning about TF32 on Intel GPUs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.backends.mkldnn.flags(enabled=enabled):
            yield


@functools.cache
def backward_convolutions_decide() -> bool:
    """Whether this torch's heuristic counts ``convolution_backward`` nodes as convolutions (a
    probe: a graph of one such node, which turns it on when counted). torch
    2.14 does not, so a training step's backward graph is lowered without layout optimisation
    (pytorch/pytorch#189239); 2.15 does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def backward(grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> object:
        return torch.ops.aten.convolution_backward.default(
            grad, x, w, [0], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]
        )

    gm = make_fx(backward, tracing_mode="fake")(
        torch.empty(2, 128, 4, 4), torch.empty(2, 128, 4, 4), torch.empty(128, 128, 1, 1)
    )  # 128 channels: neither small nor grouped nor narrowing, so a counted node turns it on
    if not torch.backends.mkldnn.is_available():
        return layout_decision(gm, inference=False, generic=True)
    with _mkldnn(enabled=True):
        return layout_decision(gm, inference=False, generic=False)
