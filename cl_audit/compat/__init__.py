"""The one module that touches torch internals, each use behind a feature test.

cl-audit needs a few things torch has no public API for: the identity of a tensor's storage, a
view's base, the autograd node running in a backward, fake tensors on a device of our choosing,
the gradient scaler's kernels (for fake tensors), ``Module._apply``, the dispatch-mode base
class, the profiler's raw events, and Inductor's layout decision. They live here and nowhere
else. A torch that lacks one raises ``UsageError`` naming the feature when it is used (never an
``AttributeError`` from deep inside an audit; the profiler's raw events fall back to its parsed
ones), and fake CUDA checks itself with a probe of known answer before it predicts anything
(``fake_cuda_problem``).
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
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses import fake_tensor as _fake
from torch.utils._python_dispatch import TorchDispatchMode

from cl_audit.errors import UsageError

__all__ = [
    "TORCH_VERSION",
    "CapturedGraph",
    "FakeTensorMode",
    "GraphConv",
    "GraphCopy",
    "ProfiledOp",
    "TorchDispatchMode",
    "amp_unscale_",
    "amp_update_scale_",
    "backward_convolutions_decide",
    "capture_graphs",
    "compile_problem",
    "current_autograd_node",
    "fake_cuda_problem",
    "fake_tensor",
    "graph_convolutions",
    "graph_nodes",
    "is_fake",
    "layout_decision",
    "layout_optimization_enabled",
    "layout_optimization_forced",
    "lowered_copies",
    "module_apply",
    "new_fake_mode",
    "op_traits",
    "profiled_ops",
    "storage_key",
    "torch_version",
    "view_base",
]

FakeTensorMode = _fake.FakeTensorMode


def torch_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``2.15.0+cu132``."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(match[1]), int(match[2])


TORCH_VERSION = torch_version(torch.__version__)


def _missing(feature: str, needed_for: str) -> UsageError:
    return UsageError(
        f"torch {torch.__version__} lacks {feature}, which {needed_for} needs; "
        "see the README's compatibility table"
    )


# --- storage identity and views (the recorder, on every operation) -------------------------

if not hasattr(torch.UntypedStorage, "_cdata"):  # pragma: no cover - no tested torch lacks it
    raise _missing("UntypedStorage._cdata", "tracking storage identity")


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of the storage (its StorageImpl address); also works for fake tensors."""
    return tensor.untyped_storage()._cdata


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor a view was taken of, or None for a tensor that owns its data."""
    return tensor._base


# --- operator traits (the cost ledger, once per distinct operator) ---------------------------

_POINTWISE = getattr(torch.Tag, "pointwise", None)
_REDUCTION = getattr(torch.Tag, "reduction", None)


def op_traits(op: object) -> tuple[bool, bool, bool, bool]:
    """``(pointwise, reduction, view, in_place)`` of an aten operator overload, from its tags,
    ``is_view`` and the trailing underscore of in-place names; all False for anything else."""
    tags = getattr(op, "tags", ())
    packet = getattr(op, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    return (
        _POINTWISE is not None and _POINTWISE in tags,
        _REDUCTION is not None and _REDUCTION in tags,
        bool(getattr(op, "is_view", False)),
        name.endswith("_") and not name.endswith("__"),
    )


# --- training --------------------------------------------------------------------------------

_current_node: Callable[[], object] | None = getattr(torch._C, "_current_autograd_node", None)


def current_autograd_node() -> object | None:
    """The autograd node whose backward is running (it names backward events)."""
    if _current_node is None:
        raise _missing("torch._C._current_autograd_node", "a training audit")
    return _current_node()


_unscale = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)
_update_scale = getattr(torch, "_amp_update_scale_", None)


def amp_unscale_(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inverse_scale: torch.Tensor
) -> None:
    """GradScaler's unscale kernel, in place."""
    if _unscale is None:
        raise _missing("torch._amp_foreach_non_finite_check_and_unscale_", "fake fp16 training")
    _unscale(grads, found_inf, inverse_scale)


def amp_update_scale_(scale: torch.Tensor, growth: torch.Tensor, found_inf: torch.Tensor) -> None:
    """GradScaler's scale update with its default factors (x2 after 2000 steps, /2 on inf)."""
    if _update_scale is None:
        raise _missing("torch._amp_update_scale_", "fake fp16 training")
    _update_scale(scale, growth, found_inf, 2.0, 0.5, 2000)


def module_apply(module: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """``Module._apply``: every parameter and buffer through ``convert``, in place, as
    ``Module.to`` does (the only way to give each tensor its own memory format)."""
    return module._apply(convert)


# --- fake tensors ----------------------------------------------------------------------------


class _FakeMode(FakeTensorMode):
    """A fake mode that computes with real tensors as eager does: an operation whose tensors are
    all real (data the model holds itself as plain tensor attributes: parameters, buffers and
    inputs are fake here) and that neither writes to them nor moves them to a device runs for
    real, so their values stay known (``for s in self.stride: x.new_full(..., s)``); torch's
    own mode turns them into fake tensors whose values nothing can read."""

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _real_only(func, args, kwargs):
            with torch.utils._mode_utils.no_dispatch():
                return func(*args, **kwargs)
        return super().dispatch(func, types, args, kwargs)


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


def _real_only(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` runs for real: every tensor real, on the CPU, none written or moved.
    Runs on every fake operation: the usual answer (a fake first argument) comes first."""
    if args and is_fake(args[0]):
        return False
    if func in _LIFTS or func._schema.is_mutable or "device" in kwargs:
        return False
    tensors = [
        a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)
    ]
    return bool(tensors) and all(
        not is_fake(t) and t.device.type == "cpu" and not t.is_meta for t in tensors
    )


def new_fake_mode() -> FakeTensorMode:
    return _FakeMode(allow_non_fake_inputs=True)


def fake_tensor(mode: FakeTensorMode, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake copy of ``tensor`` (real or meta) on ``device``, with the same strides; the
    device need not exist on this machine."""
    meta = tensor if tensor.is_meta else tensor.to("meta")
    return _fake.FakeTensor(mode, meta, device)


_is_fake: Callable[[object], bool] = getattr(
    _fake, "is_fake", lambda t: isinstance(t, _fake.FakeTensor)
)


def is_fake(tensor: object) -> bool:
    return _is_fake(tensor)


@functools.cache
def fake_cuda_problem(bfloat16: bool = False) -> str | None:
    """Why fake CUDA tensors cannot give an honest prediction with this torch, or None.

    A probe of known answer: a float32 convolution of channels_last data must come back
    channels_last (a CPU-only build has no cuDNN to choose that, and predicts NCHW), and an
    indexing step, a float16 softmax and a bfloat16 convolution must run without reaching the
    CUDA runtime (torch 2.9 and earlier do, and fail on a machine without a GPU). With
    ``bfloat16`` the bfloat16 convolution must come back channels_last too: without a GPU,
    torch 2.10 and later pick the slow NCHW convolution for bfloat16 (cuDNN's bfloat16 check
    needs a device), where a GPU with bfloat16 cuDNN keeps channels_last.
    """
    mode = new_fake_mode()
    device = torch.device("cuda")
    cl = torch.channels_last
    step = "making fake CUDA tensors"
    try:
        x = fake_tensor(mode, torch.empty(2, 16, 6, 6, device="meta").to(memory_format=cl), device)
        w = fake_tensor(mode, torch.empty(16, 16, 3, 3, device="meta").to(memory_format=cl), device)
        with mode:
            step = "a float32 convolution"
            y = F.conv2d(x, w, padding=1)
            step = "an indexing step (x[:, :4])"
            F.relu(x[:, :4])
            step = "a float16 softmax"
            F.softmax(x.half(), dim=1)
            step = "a bfloat16 convolution"
            z = F.conv2d(x.bfloat16(), w.bfloat16(), padding=1)
    except Exception as e:  # the probe's answer: the reason is given to the user
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"on torch {torch.__version__}, {step} on fake CUDA tensors fails ({cause})"
    build = " (a CPU-only build)" if torch.version.cuda is None else ""
    if not y.is_contiguous(memory_format=cl):
        return (
            f"torch {torch.__version__}{build} gives a channels_last CUDA convolution an NCHW "
            "output in fake mode, where CUDA keeps channels_last: its predictions would be wrong"
        )
    if bfloat16 and not z.is_contiguous(memory_format=cl):
        return (
            f"without a GPU, torch {torch.__version__} predicts an NCHW bfloat16 CUDA "
            "convolution (cuDNN's bfloat16 support is checked on a device), where a GPU with "
            "bfloat16 cuDNN keeps channels_last; predict with float16, or run on a GPU"
        )
    return None


# --- Inductor's layout decision (``--compile``) ----------------------------------------------


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
    mode = new_fake_mode()
    x = fake_tensor(mode, torch.empty(1, 4, 4, 4, device="meta"), torch.device("cpu"))
    w = fake_tensor(mode, torch.empty(4, 4, 1, 1, device="meta"), torch.device("cpu"))
    try:
        for graph in capture_graphs(lambda: F.conv2d(x, w)):
            lowered_copies(graph, layout_opt=True)
    except Exception as e:  # the probe's answer: the reason is given to the user
        lines = [line for line in str(e).splitlines() if line.strip()][:2]
        cause = " ".join(lines)[:200] if lines else type(e).__name__
        return (
            f"torch {torch.__version__} cannot capture and lower a compiled graph of fake "
            f"tensors, which --compile does ({cause}); see the README for the releases that can"
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


@dataclass(frozen=True)
class ProfiledOp:
    """One CPU-side profiler event: an operation or a ``record_function`` range, with its
    interval (ns) on its thread, its inputs' shapes and dtype names (empty where unrecorded)."""

    name: str
    start: int
    end: int
    thread: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


def profiled_ops(profile: torch.profiler.profile) -> tuple[ProfiledOp, ...]:
    """The CPU events of a finished profile. Read from libkineto's raw events, which cost ~2% of
    ``profile.events()``: that builds a Python object per event and their tree, seconds per
    audited training step (measured: scripts/profile_training_confirm.py). A torch whose raw
    events lack what is read gets the parsed events instead, without dtypes where they lack
    them (torch 2.4's parsed events: its raw ones have them)."""
    results = getattr(getattr(profile, "profiler", None), "kineto_results", None)
    try:
        raw = results.events()  # type: ignore[union-attr]
        return tuple(
            ProfiledOp(
                e.name(),
                e.start_ns(),
                e.start_ns() + e.duration_ns(),
                e.start_thread_id(),
                tuple(tuple(s) for s in e.shapes()),
                tuple(e.dtypes()),
            )
            for e in raw
            if e.device_type() == torch.autograd.DeviceType.CPU
        )
    except AttributeError:
        return _parsed_ops(profile)


def _parsed_ops(profile: torch.profiler.profile) -> tuple[ProfiledOp, ...]:
    return tuple(
        ProfiledOp(
            e.name,
            round(e.time_range.start * 1e3),
            round(e.time_range.end * 1e3),
            e.thread,
            tuple(tuple(s) for s in e.input_shapes or ()),
            tuple(getattr(e, "input_dtypes", None) or ()),
        )
        for e in profile.events()
        if e.device_type == torch.autograd.DeviceType.CPU
    )
