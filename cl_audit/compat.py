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
import re
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses import fake_tensor as _fake
from torch.utils._python_dispatch import TorchDispatchMode

from cl_audit.errors import UsageError

__all__ = [
    "TORCH_VERSION",
    "FakeTensorMode",
    "GraphConv",
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


def new_fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True)


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
    decision and its config switches, and a capture of fake tensors: a probe traces one
    convolution), or None."""
    try:
        from torch._dynamo.backends.common import aot_autograd  # noqa: F401
        from torch._inductor import config
        from torch._inductor.graph import GraphLowering
    except ImportError as e:
        return f"torch {torch.__version__} cannot import what --compile needs ({e})"
    missing = [
        name
        for owner, name in (
            (GraphLowering, "decide_layout_opt"),
            (config, "layout_optimization"),
            (config, "force_layout_optimization"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        names = ", ".join(missing)
        return f"torch {torch.__version__} lacks Inductor's {names}, which --compile reads"
    mode = new_fake_mode()
    x = fake_tensor(mode, torch.empty(1, 4, 4, 4, device="meta"), torch.device("cpu"))
    w = fake_tensor(mode, torch.empty(4, 4, 1, 1, device="meta"), torch.device("cpu"))
    try:
        capture_graphs(lambda: F.conv2d(x, w))
    except Exception as e:  # the probe's answer: the reason is given to the user
        lines = [line for line in str(e).splitlines() if line.strip()][:2]
        cause = " ".join(lines)[:200] if lines else type(e).__name__
        return (
            f"torch {torch.__version__} cannot capture a compiled graph of fake tensors, "
            f"which --compile traces ({cause}); see the README for the releases that can"
        )
    return None


def capture_graphs(
    fn: Callable[[], object], after: Callable[[object], None] | None = None
) -> list[tuple[str, torch.fx.GraphModule]]:
    """The FX graphs Inductor would be given for ``fn()`` (then ``after(result)``, a backward):
    ``(phase, graph)`` with phase ``inference``, ``forward`` or ``backward``, in capture order.
    Dynamo and AOTAutograd trace with a backend that keeps each graph and runs it as traced, so
    nothing is lowered. ``fn`` is compiled from a fresh code object: neither the user's compiled
    functions nor an earlier capture share its cache entries."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs: list[tuple[str, torch.fx.GraphModule]] = []

    def keep(phase: str) -> Callable[..., object]:
        def compiler(gm: torch.fx.GraphModule, example_inputs: object) -> object:
            graphs.append((phase, gm))
            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(
        fw_compiler=keep("forward"),
        bw_compiler=keep("backward"),
        inference_compiler=keep("inference"),
    )
    code = fn.__code__.replace(co_name=f"cl_audit_capture_{next(_captures)}")
    fresh = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    result = torch.compile(fresh, backend=backend, dynamic=False)()
    if after is not None:
        after(result)
    return graphs


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
        stack = node.meta.get("nn_module_stack") or {}
        module = None
        if stack:
            qualified, cls = list(stack.values())[-1]
            module = (str(qualified), cls if isinstance(cls, str) else cls.__name__)
        frames = tuple((f, int(n)) for f, n in _FRAME.findall(node.meta.get("stack_trace") or ""))
        convs.append(
            GraphConv(
                backward=node.target is torch.ops.aten.convolution_backward.default,
                weight=tuple(weight.shape),
                groups=int(groups),
                output=tuple(output.shape),
                frames=frames,
                module=module,
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
