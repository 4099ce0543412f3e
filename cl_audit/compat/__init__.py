"""The one package that touches torch internals, each use behind a feature test.

cl-audit needs a few things torch has no public API for: the identity of a tensor's storage, a
view's base, the autograd node running in a backward, fake tensors on a device of our choosing,
the gradient scaler's kernels (for fake tensors), ``Module._apply``, the dispatch-mode base
class, the profiler's raw events (all here), and Dynamo's capture and Inductor's layout decision
(``cl_audit.compat.inductor``). They live in this package and nowhere else. A torch that lacks
one raises ``UsageError`` naming the feature when it is used (never an ``AttributeError`` from
deep inside an audit; the profiler's raw events fall back to its parsed ones), and fake CUDA
checks itself with a probe of known answer before it predicts anything (``fake_cuda_problem``).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import suggest_memory_format as _suggest_memory_format
from torch._subclasses import fake_tensor as _fake
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from cl_audit.compat.memo import MISSING, OutputMemo
from cl_audit.errors import UsageError
from cl_audit.rule.layout import is_dense

__all__ = [
    "TORCH_VERSION",
    "FakeTensorMode",
    "FunctionLayer",
    "ProfiledOp",
    "Run",
    "TorchDispatchMode",
    "amp_unscale_",
    "amp_update_scale_",
    "aten_op_name",
    "current_autograd_node",
    "data_dependent_op",
    "dispatch_layer",
    "fake_cuda_problem",
    "fake_like",
    "fake_mode_alone",
    "fake_tensor",
    "flatten",
    "function_layer_taken",
    "fused_attention",
    "is_data_dependent_error",
    "is_device_runtime_error",
    "is_fake",
    "is_operator",
    "map_tensors",
    "module_apply",
    "new_fake_mode",
    "op_traits",
    "outside_modes",
    "profiled_ops",
    "storage_key",
    "suggest_memory_format",
    "tensor_leaves",
    "torch_version",
    "unflatten",
    "view_base",
    "without_torch_function",
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
        "see docs/torch-versions.md for the releases tested"
    )


# --- storage identity and views (the recorder, on every operation) -------------------------

if not hasattr(torch.UntypedStorage, "_cdata"):  # pragma: no cover - no tested torch lacks it
    raise _missing("UntypedStorage._cdata", "tracking storage identity")


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of the storage (its StorageImpl address); also works for fake tensors."""
    return tensor.untyped_storage()._cdata


# Torch function modes and subclasses off, for what cl-audit does that is no call of the
# model's: its reads of tensors' metadata, the operator a dispatch handler passes on, the
# node-by-node backward's bookkeeping. Each would pass every function mode active (cl-audit's
# own too: about 1-2 µs a mode, 43,000 calls in a vit_small training audit). The class itself,
# no wrapper: the dispatch observer enters it on every operation.
without_torch_function = torch._C.DisableTorchFunction


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor a view was taken of, or None for a tensor that owns its data."""
    return tensor._base


# --- operator traits (the cost ledger, once per distinct operator) ---------------------------

_POINTWISE = getattr(torch.Tag, "pointwise", None)
_REDUCTION = getattr(torch.Tag, "reduction", None)


def is_operator(func: object) -> bool:
    """A dispatcher operator called from Python (``torch.ops.torchvision.roi_align``)."""
    return isinstance(func, (torch._ops.OpOverloadPacket, torch._ops.OpOverload))


@functools.cache
def aten_op_name(op: object) -> str:
    """``aten.clone`` for the OpOverload ``aten.clone.default`` (once per operator: a packet's
    name is built anew at each ``str``, and every fake operation asks it)."""
    packet = getattr(op, "overloadpacket", None)
    return str(packet if packet is not None else op)


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


# passes an operation on: (operation, args, kwargs) -> its outputs
Run = Callable[[Any, Any, dict[str, Any]], Any]
# (operation, args, kwargs, run) -> its outputs
Layer = Callable[[Any, Any, dict[str, Any], Run], Any]


def _as_returned(func: Any, result: Any) -> Any:
    """A fake operation's outputs as C++ hands them to a dispatch mode above: a list for an
    operation returning a tensor list, else a plain tuple of several (a decomposition returns
    a named tuple, or a tuple for a list)."""
    if not isinstance(result, (tuple, list)):
        return result
    as_list = _LIST_RETURNS.get(func)
    if as_list is None:
        returns = func._schema.returns
        as_list = _LIST_RETURNS[func] = len(returns) == 1 and isinstance(
            returns[0].type, torch.ListType
        )
    if type(result) is (list if as_list else tuple):
        return result
    return list(result) if as_list else tuple(result)


_LIST_RETURNS: dict[Any, bool] = {}  # per operation: whether it returns a list


class _FakeMode(FakeTensorMode):
    """A fake mode that computes with real tensors as eager does: an operation whose tensors are
    all real (data the model holds itself as plain tensor attributes: parameters, buffers and
    inputs are fake here) and that neither writes to them nor moves them to a device runs for
    real, so their values stay known (``for s in self.stride: x.new_full(..., s)``); torch's
    own mode turns them into fake tensors whose values nothing can read. It answers a fake
    tensor's device query at once (``device_query``) and an operation seen before from its
    ``memo`` (``OutputMemo``, compat/memo.py). Its ``layers`` (``dispatch_layer``) see each
    operation first, outermost first, as dispatch modes pushed above it would, each a dispatch
    mode's hop cheaper (3-5 µs an operation: ~5% of a fake training step each)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        device = device_query(func, args)
        if device is not None:
            return device
        return self._through(self.layers, func, types, args, kwargs or {})

    def _through(
        self, layers: tuple[Layer, ...], func: Any, types: Any, args: Any, kwargs: dict[str, Any]
    ) -> Any:
        """``func`` through ``layers`` and then faked; while a layer runs, it and those above
        it are off ``self.layers``, as a mode is off the stack while its handler runs: what it
        runs itself passes only the layers below it."""
        if not layers:
            return _as_returned(
                func, FakeTensorMode.__torch_dispatch__(self, func, types, args, kwargs)
            )
        outer, below = self.layers, layers[1:]
        self.layers = below

        def run(op: Any, op_args: Any, op_kwargs: dict[str, Any]) -> Any:
            return self._through(below, op, types, op_args, op_kwargs)

        try:
            return layers[0](func, args, kwargs, run)
        finally:
            self.layers = outer

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.memo = OutputMemo(self)
        self.layers: tuple[Layer, ...] = ()  # outermost first
        self._remembering = False  # the next cache lookup is for an operation the memo keeps

    def _cached_dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """Torch's cache, but for an operation the memo keeps: its key and entry would cost
        as much as the dispatch and never be read (the memo answers the call next time)."""
        if self._remembering:
            self._remembering = False
            return self._dispatch_impl(func, types, args, kwargs)
        return super()._cached_dispatch_impl(func, types, args, kwargs)

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (
            args
            and type(args[0]) is list  # ahead of the schema's lookup, which hashes the operator
            and self.shape_env is None
            and _writes_lists(func)
            and _valid_as_laid_out(args, kwargs)
        ):
            return None  # nothing to fake: it writes its lists in place (``_valid_as_laid_out``)
        if _real_only(func, args, kwargs):
            with torch.utils._mode_utils.no_dispatch():
                return func(*args, **kwargs)
        memo = self.memo
        key = memo.key(func, args, kwargs) if _MEMO else None
        if key is not None:
            outputs = memo.lookup(key, func, args, kwargs)
            if outputs is not MISSING:
                return outputs
        self._remembering = key is not None
        try:
            result = self._fake_dispatch(func, types, args, kwargs)
        finally:
            self._remembering = False
        if key is not None:
            memo.remember(key, func, args, kwargs, result, tensor_leaves((args, kwargs)))
        return result

    def _fake_dispatch(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        operands = _binary_operands(func, args)
        if operands is not None:
            return super().dispatch(_MUL, types, operands, {})
        if func is _TO_COPY and _dense_cast(args, kwargs):
            data = args[0]
            dtype = kwargs.get("dtype") or data.dtype
            if self.shape_env is None:  # as the memo makes a fresh output: no general path
                meta = torch.empty_strided(data.shape, data.stride(), dtype=dtype, device="meta")
                return self.memo.wrap(meta, data.fake_device)
            strided = (data.shape, data.stride())
            return super().dispatch(
                _EMPTY_STRIDED, types, strided, {"dtype": dtype, "device": data.device}
            )
        if self.shape_env is None:  # the kernels' layouts, where shapes are plain numbers
            aliased = 0 if func is _UNSAFE_VIEW else self.memo.aliased(func)
            if aliased is not None:
                return self._view(func, types, args, kwargs, aliased)
            if func is _LAYER_NORM_BACKWARD:
                return self._layer_norm_backward(types, args, kwargs)
            if func in _ON_META:
                return self._on_meta(func, types, args, kwargs)
        return super().dispatch(func, types, args, kwargs)

    def _on_meta(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """The training loss's operations and some backward operations (``_ON_META``) by the
        operator's kernel for the meta device (torch's meta registration: for a decomposed
        operation, the same Python decomposition torch's fake mode runs, each of its operations
        a meta kernel's call instead of a fake dispatch; else the meta function torch's fake
        mode calls too, where it has no fake implementation of its own) on meta tensors laid
        out as its arguments, the outputs made fake tensors: torch's fake mode runs a
        decomposition's tens of operations each as a fake dispatch (2-13 ms a call), and wraps
        a meta function's outputs by its general path (0.4-0.8 ms). Every tensor argument
        fake, strided, real-valued and on one device, else torch's path."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        device = tensors[0].device if tensors else None
        if not all(_plain_fake(t) and t.device == device for t in tensors):
            return super().dispatch(func, types, args, kwargs)

        def meta(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            return torch.empty_strided(
                value.shape, value.stride(), dtype=value.dtype, device="meta"
            )

        with torch.utils._mode_utils.no_dispatch():
            result = func(*map(meta, args), **{k: meta(v) for k, v in kwargs.items()})
        if isinstance(result, tuple):
            return tuple(None if t is None else self.memo.wrap(t, device) for t in result)
        return self.memo.wrap(result, device)

    def _layer_norm_backward(self, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``native_layer_norm_backward``'s gradients as the CPU and CUDA kernels allocate them
        (layer_norm.cpp, cuda/layer_norm_kernel.cu): ``empty_like`` of the contiguous input,
        weight and bias with ``LEGACY_CONTIGUOUS_MEMORY_FORMAT``, each where ``output_mask``
        asks for it and its tensor exists. Torch fakes it by a Python decomposition of some
        forty operations (15 ms a shape), whose input gradient in torch 2.14 and 2.15 follows
        the incoming gradient's strides (2.4.1's is contiguous): a layer norm over a
        channels_last map's permuted tokens (CoAtNet's ``LayerNorm2d``) then handed the map
        back in the other order."""
        if kwargs or len(args) != 8:
            return super().dispatch(_LAYER_NORM_BACKWARD, types, args, kwargs)
        data, weight, bias, mask = args[1], args[5], args[6], args[7]

        def like(tensor: torch.Tensor | None, wanted: bool) -> torch.Tensor | None:
            if tensor is None or not wanted:
                return None
            meta = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
            return self.memo.wrap(meta, tensor.device)

        return like(data, mask[0]), like(weight, mask[1]), like(bias, mask[2])

    def _view(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any], aliased: int) -> Any:
        """A view of the argument at ``aliased`` (or ``_unsafe_view``, on its argument's
        storage), as every device's kernel makes it: the operator's kernel for the meta device
        (for a view, the C++ code the CPU and CUDA kernels of a view run; for ``_unsafe_view``,
        torch's meta registration; both tested against the CPU kernel) on a meta tensor laid
        out as the argument, on its storage, made a fake tensor. Torch's fake mode runs a view
        through its general path (a fifth of a millisecond each), and fakes ``view`` and
        ``_unsafe_view`` by ``torch._refs._reshape_view_helper``, which gives a size-1
        dimension another stride than the kernels' ``computeStride`` (TensorUtils.cpp): a
        (1, 24, 64) gradient viewed as (1, 24, 8, 8) is channels_last to torch's fake mode and
        NCHW to the kernels (batch stride 1536 against 24), so a kernel handed it lays out its
        output otherwise. Any other tensor argument, a fake constant or a complex or sparse
        argument goes to torch's path."""
        base = args[aliased] if aliased < len(args) else None
        if not _plain_fake(base):
            return super().dispatch(func, types, args, kwargs)
        rest = (*args[:aliased], *args[aliased + 1 :], *kwargs.values())
        if any(isinstance(a, torch.Tensor) for a in rest):
            return super().dispatch(func, types, args, kwargs)
        with torch.utils._mode_utils.no_dispatch():
            meta = torch.empty(0, dtype=base.dtype, device="meta")
            meta.set_(base.untyped_storage(), base.storage_offset(), base.shape, base.stride())
            viewed = func(*args[:aliased], meta, *args[aliased + 1 :], **kwargs)
        return self.memo.wrap(viewed, base.fake_device)


_MEMO = True  # OutputMemo answers the operations it can (off: torch's cache alone)
_aten = torch.ops.aten
_MUL = _aten.mul.Tensor
# Activations' backward kernels are binary TensorIterator operations on two of their arguments,
# in this order (their meta functions in aten/src/ATen/native/Activation.cpp, or their CUDA
# kernels: ``build_borrowing_binary_op(grad_input, a, b)``); torch fakes them by Python
# decompositions of tens of fake operations, where a multiplication of the same two tensors
# gives the same output.
_BINARY_BACKWARDS = {
    _aten.silu_backward.default: (0, 1),
    _aten.sigmoid_backward.default: (0, 1),
    _aten.tanh_backward.default: (0, 1),
    _aten.gelu_backward.default: (0, 1),
    _aten.threshold_backward.default: (1, 0),
    _aten.hardtanh_backward.default: (0, 1),
    _aten.hardswish_backward.default: (0, 1),
    _aten.hardsigmoid_backward.default: (0, 1),
    _aten.leaky_relu_backward.default: (1, 0),
    _aten.elu_backward.default: (0, 5),
    _aten.mish_backward.default: (0, 1),
    _aten.softplus_backward.default: (0, 1),
}


_TO_COPY = _aten._to_copy.default
_UNSAFE_VIEW = _aten._unsafe_view.default
_LAYER_NORM_BACKWARD = _aten.native_layer_norm_backward.default
# cross-entropy's operations, which a training audit's own loss runs on every classifier, and
# backward operations a training step sends many of, which torch fakes by their meta kernels
# too (no fake implementation of their own, unlike convolution's, whose fake layout follows the
# device's backend): group norm's (4-13 ms a call by torch's fake path, 2 ms on meta tensors),
# the fused attention kernels' and batch norm's (0.7 against 0.1 ms, measured on 145 calls of
# nine timm models, the outputs alike in each)
_ON_META = frozenset(
    {
        _aten._log_softmax.default,
        _aten._log_softmax_backward_data.default,
        _aten.nll_loss_forward.default,
        _aten.nll_loss_backward.default,
        _aten.native_group_norm_backward.default,
        _aten._scaled_dot_product_cudnn_attention_backward.default,
        _aten._scaled_dot_product_efficient_attention_backward.default,
        _aten.native_batch_norm_backward.default,
    }
)
_EMPTY_STRIDED = _aten.empty_strided.default
_CAST_KEYWORDS = {"dtype", "memory_format", "layout", "device", "pin_memory", "non_blocking"}


def _plain_fake(value: Any) -> bool:
    """Whether ``value`` is a fake tensor whose metadata alone decides what a meta kernel
    makes of it: strided, real-valued, no value tracked (a fake constant)."""
    return (
        type(value) is _fake.FakeTensor
        and value.constant is None
        and value.layout is torch.strided
        and not value.dtype.is_complex
    )


def _dense_cast(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a ``_to_copy`` only changes the dtype (or nothing) of a tensor with dense,
    non-overlapping strides: its kernel (TensorConversions.cpp, ``memory_format`` preserve)
    then allocates ``empty_strided`` with the same strides, which torch fakes by a Python
    decomposition."""
    if len(args) != 1 or not is_fake(args[0]) or not kwargs.keys() <= _CAST_KEYWORDS:
        return False
    data = args[0]
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return False
    if kwargs.get("device") not in (None, data.device) or kwargs.get("non_blocking"):
        return False
    return data.layout == torch.strided and is_dense(data.shape, data.stride())


def _binary_operands(func: Any, args: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The two tensors an activation's backward kernel iterates over, in its order, where they
    have one shape and dtype (no broadcast, no promotion); else None."""
    order = _BINARY_BACKWARDS.get(func)
    if order is None:
        return None
    a, b = args[order[0]], args[order[1]]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    return a, b


@functools.cache
def _writes_lists(func: Any) -> bool:
    """An operation that returns nothing and writes the list of tensors it is first given:
    the optimizers' ``_foreach_*_``, AMP's unscale, the fused optimizers."""
    schema = getattr(func, "_schema", None)
    if schema is None or schema.returns or not schema.arguments:
        return False
    first = schema.arguments[0]
    info = first.alias_info
    return str(first.type) == "List[Tensor]" and info is not None and info.is_write


_NUMBERS = (int, float, bool)


def _valid_as_laid_out(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a ``_writes_lists`` operation is valid on any device's kernel, seen from its
    arguments alone: its tensor lists as long as the first, and index by index fake tensors of
    one shape, dtype and device, floating point, without a constant; its other lists numbers,
    as many; each other tensor one floating-point element on the first list's device; the rest
    numbers or None. Such an operation changes no tensor's metadata and returns nothing, so
    its fake kernel (per tensor: a broadcast check in Python, 8 ms an SGD step of ResNet-50's
    161 parameters) has nothing to tell; anything else goes to torch's, as does every call
    with a shape environment (comparing symbolic shapes would add guards)."""
    first = args[0]
    if not first:
        return False
    lists, lone = [], []
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            if len(value) != len(first):
                return False
            if isinstance(value[0], torch.Tensor):
                lists.append(value)
            elif not all(type(v) in _NUMBERS for v in value):
                return False
        elif isinstance(value, torch.Tensor):
            lone.append(value)
        elif value is not None and type(value) not in _NUMBERS:
            return False
    for group in zip(*lists, strict=True):
        head = group[0]
        for tensor in group:
            if type(tensor) is not _fake.FakeTensor or tensor.constant is not None:
                return False
            if tensor.shape != head.shape or tensor.dtype != head.dtype:
                return False
            if tensor.fake_device != head.fake_device or not tensor.dtype.is_floating_point:
                return False
    device = first[0].fake_device
    return all(
        type(t) is _fake.FakeTensor
        and t.constant is None
        and t.numel() == 1
        and t.dtype.is_floating_point
        and t.fake_device == device
        for t in lone
    )


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


def _real_only(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` runs for real: every tensor real, on the CPU, none written or moved.
    Runs on every fake operation: the usual answer (a fake first argument) comes first."""
    if args and (type(args[0]) is _fake.FakeTensor or is_fake(args[0])):
        return False  # the exact type first: torch's ``is_fake`` checks subclasses at length
    if func in _LIFTS or func._schema.is_mutable or "device" in kwargs:
        return False
    tensors = tensor_leaves((args, kwargs))
    return bool(tensors) and all(
        not is_fake(t) and t.device.type == "cpu" and not t.is_meta for t in tensors
    )


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


def outside_modes() -> contextlib.AbstractContextManager[object]:
    """No dispatch mode (fake or other) active inside: tensors made there are what they say."""
    return torch.utils._python_dispatch._disable_current_modes()


def suggest_memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """``Tensor::suggest_memory_format()`` (C++ only): channels_last(_3d) for strides like it,
    else contiguous; the format kernels allocate their outputs in."""
    return _suggest_memory_format(tensor)


def new_fake_mode() -> FakeTensorMode:
    return _FakeMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def dispatch_layer(mode: FakeTensorMode, layer: Layer) -> Iterator[None]:
    """``layer`` sees every operation ``mode`` fakes from outside it (not those the fake mode
    runs itself, as a decomposition's) before the mode and the layers already there do, as a
    dispatch mode pushed above them would; ``mode`` from ``new_fake_mode``."""
    if not isinstance(mode, _FakeMode):
        raise TypeError("a dispatch layer needs cl-audit's fake mode (new_fake_mode)")
    mode.layers = (layer, *mode.layers)
    try:
        yield
    finally:
        mode.layers = tuple(other for other in mode.layers if other is not layer)


def fake_mode_alone() -> FakeTensorMode | None:
    """The active fake mode where it is cl-audit's (``new_fake_mode``) and no other dispatch
    mode is active, else None: then a mode pushed now could be a layer of it instead."""
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if isinstance(mode, _FakeMode) and torch._C._len_torch_dispatch_stack() == 1:
        return mode
    return None


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


def fake_tensor(mode: FakeTensorMode, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake copy of ``tensor`` (real or meta) on ``device``, with the same strides; the
    device need not exist on this machine."""
    meta = tensor if tensor.is_meta else tensor.to("meta")
    memo = getattr(mode, "memo", None)  # cl-audit's fake mode makes it faster (``fake_maker``)
    return _fake.FakeTensor(mode, meta, device) if memo is None else memo.wrap(meta, device)


def fake_like(tensor: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """A fake copy of ``tensor`` in the fake mode of the fake tensor ``fake``: on its device
    where ``tensor`` is a meta tensor, else on ``tensor``'s own."""
    device = fake.device if tensor.is_meta else tensor.device
    return fake_tensor(fake.fake_mode, tensor, device)


_is_fake: Callable[[object], bool] = getattr(
    _fake, "is_fake", lambda t: isinstance(t, _fake.FakeTensor)
)


def is_fake(tensor: object) -> bool:
    return _is_fake(tensor)


_DEVICE = torch.ops.prim.device.default


def device_query(func: Any, args: Any) -> torch.device | None:
    """The device a fake tensor reports for ``prim.device``, or None for any other call.

    C++ asks the device of every fake tensor an operation touches (autograd twice per tensor,
    the optimizer's grouping once), most of a fake training step's dispatches; a mode can answer
    it from the tensor instead of passing it down the stack, as torch's own handler does
    (``_device_handler`` in torch/_subclasses/fake_tensor.py: ``meta`` inside a kernel)."""
    if func is _DEVICE and isinstance(args[0], _fake.FakeTensor):
        return args[0].device
    return None


_DEVICE_ERRORS = tuple(
    kind for kind in (getattr(torch, "AcceleratorError", None),) if isinstance(kind, type)
)


_DATA_DEPENDENT = tuple(
    kind
    for kind in (
        getattr(_fake, "DataDependentOutputException", None),
        getattr(_fake, "DynamicOutputShapeException", None),
    )
    if isinstance(kind, type)
)


def is_data_dependent_error(error: BaseException) -> bool:
    """Whether a fake run failed because the model read a tensor's value (a branch on it)."""
    return isinstance(error, _DATA_DEPENDENT)


def data_dependent_op(error: BaseException) -> str | None:
    """The operation whose output depends on tensor values (``aten.nonzero.default``) that a
    fake run refused, found in ``error`` or the exceptions it was raised from; else None."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, _DATA_DEPENDENT):
            return str(seen.func)
        seen = seen.__cause__ or seen.__context__
    return None


def is_device_runtime_error(error: BaseException) -> bool:
    """Whether ``error`` came from a device runtime (torch 2.8 and later raise
    ``torch.AcceleratorError``; earlier releases a RuntimeError saying "CUDA error")."""
    if isinstance(error, _DEVICE_ERRORS):
        return True
    return isinstance(error, RuntimeError) and str(error).startswith(
        ("CUDA error", "Found no NVIDIA driver")
    )


def fused_attention(
    efficient: bool,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None,
    log_sumexp: bool,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor | None:
    """The output of CUDA's fused attention kernel, called as ``F.scaled_dot_product_attention``
    calls it: the memory-efficient one or cuDNN's, given the arguments this torch's operator
    takes (read from its schema). None where one is given a mask its operator takes none of
    (torch 2.4's cuDNN operator)."""
    operator = _attention_operator(efficient)
    if operator is None:
        return None
    overload, names = operator
    if bias is not None and "attn_bias" not in names:
        return None
    given = {
        "query": query, "key": key, "value": value, "attn_bias": bias,
        "compute_log_sumexp": log_sumexp, "dropout_p": 0.0, "is_causal": is_causal,
        "return_debug_mask": False, "scale": scale,
    }  # fmt: skip
    return overload(**{k: v for k, v in given.items() if k in names})[0]


@functools.cache
def _attention_operator(efficient: bool) -> tuple[Any, frozenset[str]] | None:
    """The fused attention operator's default overload and its arguments' names, read once."""
    name = "_scaled_dot_product_efficient_attention" if efficient else (
        "_scaled_dot_product_cudnn_attention"
    )  # fmt: skip
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None
    return packet.default, frozenset(a.name for a in packet.default._schema.arguments)


def cuda_present() -> bool:
    """Whether this machine has a CUDA device, asked so that forked workers can still use it.
    ``torch.cuda.is_available()`` asks the CUDA runtime (unless PYTORCH_NVML_BASED_CUDA_CHECK is
    set), after which torch refuses CUDA in every child forked later ("Cannot re-initialize CUDA
    in forked subprocess": every row of an eager CUDA sweep, seen on an H200 with torch 2.11);
    ``device_count`` asks NVML first and does not poison fork when NVML answers."""
    return torch.cuda.device_count() > 0


@functools.cache
def fake_cuda_problem(bfloat16: bool = False, runtime: bool = True) -> str | None:
    """Why fake CUDA tensors cannot give an honest prediction with this torch, or None.

    A probe of known answer: a float32 convolution of channels_last data must come back
    channels_last (a CPU-only build has no cuDNN to choose that, and predicts NCHW), and an
    indexing step, a float16 softmax and a bfloat16 convolution must run without reaching the
    CUDA runtime (torch 2.9 and earlier do, and fail on a machine without a GPU; not probed
    with ``runtime`` False, for a caller that makes each call reaching it an error of its own).
    With ``bfloat16`` the bfloat16 convolution must come back channels_last too: without a
    GPU, torch 2.10 and later pick the slow NCHW convolution for bfloat16 (cuDNN's bfloat16
    check needs a device), where a GPU with bfloat16 cuDNN keeps channels_last.
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
            y = z = F.conv2d(x, w, padding=1)
            if runtime:
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


# --- the profiler's events (timing, and the copies an eager cost ledger measures) ------------


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
