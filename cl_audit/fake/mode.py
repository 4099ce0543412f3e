"""cl-audit's fake tensor mode (``new_fake_mode``): fake tensors on a device of our choosing,
real tensors computed as eager does, the layers that see each operation, and the shortcuts of
``shortcuts`` taken where torch's own path is slow or lays a tensor out otherwise than the
kernels. Built on torch's fake mode through ``compat.fake_base.FakeModeBase``, which names the
entry points it overrides and calls."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from cl_audit.compat.fake_base import (
    FAKE_LOGGER,
    FakeModeBase,
    FakeTensorMode,
    Layer,
    active_fake_mode_alone,
    device_query,
    make_fake,
    no_dispatch,
)
from cl_audit.compat.operators import returns_list
from cl_audit.compat.pytree import tensor_leaves
from cl_audit.fake.memo import MISSING, OutputMemo
from cl_audit.fake.shortcuts import (
    EMPTY_STRIDED,
    LAYER_NORM_BACKWARD,
    MUL,
    ON_META,
    TO_COPY,
    UNSAFE_VIEW,
    binary_operands,
    dense_cast,
    plain_fake,
    real_only,
    valid_as_laid_out,
    writes_lists,
)

__all__ = [
    "dispatch_layer",
    "fake_like",
    "fake_mode_alone",
    "fake_tensor",
    "meta_failures_quiet",
    "new_fake_mode",
]


def _as_returned(func: Any, result: Any) -> Any:
    """A fake operation's outputs as C++ hands them to a dispatch mode above: a list for an
    operation returning a tensor list, else a plain tuple of several (a decomposition returns
    a named tuple, or a tuple for a list)."""
    if not isinstance(result, (tuple, list)):
        return result
    as_list = _LIST_RETURNS.get(func)
    if as_list is None:
        as_list = _LIST_RETURNS[func] = returns_list(func)
    if type(result) is (list if as_list else tuple):
        return result
    return list(result) if as_list else tuple(result)


_LIST_RETURNS: dict[Any, bool] = {}  # per operation: whether it returns a list


class _FakeMode(FakeModeBase):
    """A fake mode that computes with real tensors as eager does: an operation whose tensors are
    all real (data the model holds itself as plain tensor attributes: parameters, buffers and
    inputs are fake here) and that neither writes to them nor moves them to a device runs for
    real, so their values stay known (``for s in self.stride: x.new_full(..., s)``); torch's
    own mode turns them into fake tensors whose values nothing can read. It answers a fake
    tensor's device query at once (``device_query``) and an operation seen before from its
    ``memo`` (``OutputMemo``, fake/memo.py). Its ``layers`` (``dispatch_layer``) see each
    operation first, outermost first, as dispatch modes pushed above it would, each a dispatch
    mode's hop cheaper (reports/pages/overhead.md)."""

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
            return _as_returned(func, self.torch_dispatch(func, types, args, kwargs))
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

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """An operation faked: by the memo where it answers, else faked and remembered, torch's
        cache skipped for an operation the memo keeps (its key and entry would cost as much as
        the dispatch and never be read: the memo answers the call next time)."""
        kwargs = kwargs or {}
        if (
            args
            and type(args[0]) is list  # ahead of the schema's lookup, which hashes the operator
            and self.shape_env is None
            and writes_lists(func)
            and valid_as_laid_out(args, kwargs)
        ):
            return None  # nothing to fake: it writes its lists in place (``valid_as_laid_out``)
        if real_only(func, args, kwargs):
            with no_dispatch():
                return func(*args, **kwargs)
        memo = self.memo
        key = memo.key(func, args, kwargs) if _MEMO else None
        if key is not None:
            outputs = memo.lookup(key, func, args, kwargs)
            if outputs is not MISSING:
                return outputs
        self.skip_cache_once = key is not None
        try:
            result = self._faked(func, types, args, kwargs)
        finally:
            self.skip_cache_once = False
        if key is not None:
            memo.remember(key, func, args, kwargs, result, tensor_leaves((args, kwargs)))
        return result

    def _faked(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        operands = binary_operands(func, args)
        if operands is not None:
            return self.torch_fake(MUL, types, operands, {})
        if func is TO_COPY and dense_cast(args, kwargs):
            data = args[0]
            dtype = kwargs.get("dtype") or data.dtype
            if self.shape_env is None:  # as the memo makes a fresh output: no general path
                meta = torch.empty_strided(data.shape, data.stride(), dtype=dtype, device="meta")
                return self.memo.wrap(meta, data.fake_device)
            strided = (data.shape, data.stride())
            return self.torch_fake(
                EMPTY_STRIDED, types, strided, {"dtype": dtype, "device": data.device}
            )
        if self.shape_env is None:  # the kernels' layouts, where shapes are plain numbers
            aliased = 0 if func is UNSAFE_VIEW else self.memo.aliased(func)
            if aliased is not None:
                return self._view(func, types, args, kwargs, aliased)
            if func is LAYER_NORM_BACKWARD:
                return self._layer_norm_backward(types, args, kwargs)
            if func in ON_META:
                return self._on_meta(func, types, args, kwargs)
        return self.torch_fake(func, types, args, kwargs)

    def _on_meta(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """The training loss's operations and some backward operations (``ON_META``) by the
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
        if not all(plain_fake(t) and t.device == device for t in tensors):
            return self.torch_fake(func, types, args, kwargs)

        def meta(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            return torch.empty_strided(
                value.shape, value.stride(), dtype=value.dtype, device="meta"
            )

        with no_dispatch():
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
            return self.torch_fake(LAYER_NORM_BACKWARD, types, args, kwargs)
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
        if not plain_fake(base):
            return self.torch_fake(func, types, args, kwargs)
        rest = (*args[:aliased], *args[aliased + 1 :], *kwargs.values())
        if any(isinstance(a, torch.Tensor) for a in rest):
            return self.torch_fake(func, types, args, kwargs)
        with no_dispatch():
            meta = torch.empty(0, dtype=base.dtype, device="meta")
            meta.set_(base.untyped_storage(), base.storage_offset(), base.shape, base.stride())
            viewed = func(*args[:aliased], meta, *args[aliased + 1 :], **kwargs)
        return self.memo.wrap(viewed, base.fake_device)


_MEMO = True  # OutputMemo answers the operations it can (off: torch's cache alone)


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
    mode = active_fake_mode_alone()
    return mode if isinstance(mode, _FakeMode) else None


def fake_tensor(mode: FakeTensorMode, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake copy of ``tensor`` (real or meta) on ``device``, with the same strides; the
    device need not exist on this machine."""
    meta = tensor if tensor.is_meta else tensor.to("meta")
    memo = getattr(mode, "memo", None)  # cl-audit's fake mode makes it faster (``fake_maker``)
    return make_fake(mode, meta, device) if memo is None else memo.wrap(meta, device)


def fake_like(tensor: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """A fake copy of ``tensor`` in the fake mode of the fake tensor ``fake``: on its device
    where ``tensor`` is a meta tensor, else on ``tensor``'s own."""
    device = fake.device if tensor.is_meta else tensor.device
    return fake_tensor(fake.fake_mode, tensor, device)


@contextlib.contextmanager
def meta_failures_quiet() -> Iterator[None]:
    """Torch's fake mode logs, with a traceback, every operation whose meta function refuses
    its arguments before raising it (``failed while attempting to run meta``): quiet inside,
    where refusals are expected (an operator index's samples); the error is still raised."""
    logger = logging.getLogger(FAKE_LOGGER)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
