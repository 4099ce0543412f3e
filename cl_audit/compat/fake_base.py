"""What cl-audit's fake engine (``cl_audit.fake``) needs of torch's fake tensors, which have no
public API: the fake mode class with the two entry points the engine builds on, the fake tensor
class, ``is_fake``, the device a fake tensor reports, a fast fake-tensor maker, the active mode's
place on the dispatch stack, and the signature of a layer of the engine's mode."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses import fake_tensor as _fake
from torch.fx.experimental import proxy_tensor as _proxy
from torch.utils import _mode_utils

__all__ = [
    "FAKE_LOGGER",
    "FakeModeBase",
    "FakeTensor",
    "FakeTensorMode",
    "Layer",
    "Run",
    "active_fake_mode_alone",
    "device_query",
    "fake_maker",
    "is_fake",
    "make_fake",
    "no_dispatch",
    "tracing",
]


FakeTensorMode = _fake.FakeTensorMode


FakeTensor = _fake.FakeTensor


FAKE_LOGGER = _fake.__name__  # the logger of torch's fake mode


no_dispatch = _mode_utils.no_dispatch  # runs an operation with no mode active: a kernel call


# get_proxy_mode (pre-dispatch tracing too) is newer than torch 2.4, which has the innermost only
tracing: Callable[[], object] = (
    getattr(_proxy, "get_proxy_mode", None) or _proxy.get_innermost_proxy_mode
)


# passes an operation on: (operation, args, kwargs) -> its outputs
Run = Callable[[Any, Any, dict[str, Any]], Any]


# (operation, args, kwargs, run) -> its outputs
Layer = Callable[[Any, Any, dict[str, Any], Run], Any]


class FakeModeBase(FakeTensorMode):
    """Torch's fake mode with the entry points cl-audit's engine builds on named: the engine
    overrides ``dispatch`` (torch calls it for every operation the mode fakes) and falls back
    on ``torch_fake``, torch's own faking of one operation; ``torch_dispatch`` is torch's
    handler of the dispatch mode, and ``skip_cache_once`` bypasses torch's cache for the next
    operation (one the engine remembers itself: its key and entry would never be read)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.skip_cache_once = False

    def torch_fake(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return FakeTensorMode.dispatch(self, func, types, args, kwargs)

    def torch_dispatch(self, func: Any, types: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return FakeTensorMode.__torch_dispatch__(self, func, types, args, kwargs)

    def _cached_dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if self.skip_cache_once:
            self.skip_cache_once = False
            return self._dispatch_impl(func, types, args, kwargs)
        return super()._cached_dispatch_impl(func, types, args, kwargs)


def active_fake_mode_alone() -> FakeTensorMode | None:
    """The active fake mode where no other dispatch mode is active, else None."""
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    return mode if mode is not None and torch._C._len_torch_dispatch_stack() == 1 else None


_is_fake: Callable[[object], bool] = getattr(
    _fake, "is_fake", lambda t: isinstance(t, _fake.FakeTensor)
)


def is_fake(tensor: object) -> bool:
    return _is_fake(tensor)


def make_fake(mode: FakeTensorMode, meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor of ``mode`` on ``device`` laid out as the meta tensor ``meta``."""
    return _fake.FakeTensor(mode, meta, device)


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


_PLAIN_STATE = (type(None), bool, int, float, str, torch.device, torch.DispatchKeySet, type)


def fake_maker(
    mode: FakeTensorMode, device: torch.device
) -> Callable[[torch.Tensor], torch.Tensor]:
    """What makes a fake tensor of ``mode`` on ``device`` from a meta tensor, as
    ``FakeTensor(mode, meta, device)`` does, in under a quarter of its time (a remembered
    output is made so on every hit, and the constructor parses arguments, normalizes the
    device and sets a dozen attributes through descriptors): the
    subclass made on the meta tensor with the same dispatch keys and data-pointer guard, then
    the attributes of a fake tensor the constructor made, copied. Used only where such a copy
    is what the constructor makes (each attribute the mode or a plain immutable value; a probe
    made both ways alike); else the constructor."""
    construct = functools.partial(_fake.FakeTensor, mode, device=device)
    template = construct(torch.empty(0, device="meta"))
    state = dict(vars(template))
    if any(v is not mode and not isinstance(v, _PLAIN_STATE) for v in state.values()):
        return construct
    guard = (
        torch._C._set_warn_deprecated_on_mutable_data_ptr
        if mode._allow_unsafe_data_ptr_access
        else torch._C._set_throw_on_mutable_data_ptr
    )
    fake_device = template.fake_device

    def made(meta: torch.Tensor) -> torch.Tensor:
        tensor = torch.Tensor._make_subclass(
            _fake.FakeTensor,
            meta,
            meta.requires_grad,
            dispatch_device=True,
            device_for_backend_keys=fake_device,
        )
        guard(tensor)
        tensor.__dict__.update(state)
        return tensor

    probe = torch.empty_strided((2, 3), (1, 2), device="meta", requires_grad=True)
    if _described(made(probe)) != _described(construct(probe)):
        return construct
    return made


def _described(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What tells two fake tensors made on one meta tensor apart."""
    return (
        type(tensor),
        vars(tensor),
        tensor.device,
        tensor.requires_grad,
        tensor.stride(),
        str(torch._C._dispatch_keys(tensor)),
    )
