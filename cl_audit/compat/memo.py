"""The outputs of fake operations, remembered by what decides them: a faster hit than torch's cache.

A fake operation's outputs are decided by the operation, the metadata of its tensors (shape,
strides, dtype, device, storage offset) and its other arguments: no values. Torch's fake mode
caches them too (``FakeTensorMode._cached_dispatch_impl``), but a hit costs about 150 µs on this
machine (a general key over every argument kind, the output rebuilt under the kernel-invocation
guard), most of a fake training step. ``OutputMemo`` keeps the same answer for the operations
whose outputs are fresh tensors or views of one argument, and rebuilds them from their metadata
(a view on its argument's storage, as torch's cache does) in about a third of that (a
multiplication's hit: 183 -> 55 µs).

Remembered only: builtin (``aten``/``prims``) operations that write to none of their arguments,
none tagged as data-dependent, dynamic-shaped, seeded or in-place-view; views only where one
tensor is returned, aliasing one argument, and no composite kernel decides whether it aliases
(torch's cache draws the same line); every tensor argument fake, without a constant, not
complex; every output of the others a fake tensor (or None) on a storage of its own. Anything
else goes to torch's mode, as does every call while a proxy mode traces or with a shape
environment (symbolic shapes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import fake_tensor as _fake
from torch.fx.experimental import proxy_tensor as _proxy

__all__ = ["OutputMemo"]

_EXCLUDED_TAGS = frozenset(
    getattr(torch.Tag, name)
    for name in (
        "data_dependent_output",
        "dynamic_output_shape",
        "inplace_view",
        "nondeterministic_seeded",
    )
    if hasattr(torch.Tag, name)
)
# get_proxy_mode (pre-dispatch tracing too) is newer than torch 2.4, which has the innermost only
_tracing = getattr(_proxy, "get_proxy_mode", None) or _proxy.get_innermost_proxy_mode
_NAMESPACES = frozenset({"aten", "prims"})
_PLAIN = frozenset(
    {
        int,
        float,
        bool,
        str,
        type(None),
        torch.dtype,
        torch.device,
        torch.memory_format,
        torch.layout,
    }
)
# an output: shape, strides, dtype, device, then requires_grad (fresh) or storage offset (view)
_Spec = tuple[Any, ...] | None


class _Unkeyable(Exception):
    """An argument the memo does not key (a real tensor, a symbol, an object)."""


def _key(value: Any) -> Any:
    kind = type(value)
    if kind is _fake.FakeTensor:
        if value.constant is not None or value.dtype.is_complex or value.is_sparse:
            raise _Unkeyable
        return (
            value.shape,
            value.stride(),
            value.dtype,
            value.fake_device,
            value.storage_offset(),
            value.requires_grad,
        )
    if kind in _PLAIN:
        return (kind, value)
    if kind is list or kind is tuple:
        return (kind, *[_key(v) for v in value])
    raise _Unkeyable


def _remembered(func: Any) -> int | bool:
    """Whether ``func``'s outputs can be remembered (module docstring): for a view, the
    position of the argument it aliases."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace not in _NAMESPACES:
        return False
    if _EXCLUDED_TAGS.intersection(func.tags):
        return False
    schema = func._schema
    aliased = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None]
    returned = [r.alias_info for r in schema.returns]
    if not aliased and not any(returned):
        return True
    if not func.is_view or len(aliased) != 1 or len(returned) != 1 or returned[0] is None:
        return False
    if schema.arguments[aliased[0]].alias_info.is_write or returned[0].is_write:
        return False
    if str(schema.returns[0].type) != "Tensor" or torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), torch._C.DispatchKey.CompositeImplicitAutograd
    ):
        return False
    return aliased[0]


def _fresh(output: Any, inputs: list[torch.Tensor]) -> _Spec:
    """A fresh output's metadata; anything else (a view, a constant) is not kept."""
    if output is None:
        return None
    if type(output) is not _fake.FakeTensor or output.constant is not None:
        raise _Unkeyable
    storage = output.untyped_storage()._cdata
    if output.storage_offset() or any(storage == i.untyped_storage()._cdata for i in inputs):
        raise _Unkeyable
    return (output.shape, output.stride(), output.dtype, output.fake_device, output.requires_grad)


def _view(output: Any, base: Any) -> _Spec:
    """A view's metadata, with its storage offset: on ``base``'s storage, not requiring grad."""
    if type(output) is not _fake.FakeTensor or type(base) is not _fake.FakeTensor:
        raise _Unkeyable
    if output.constant is not None or output.requires_grad:
        raise _Unkeyable
    if output.untyped_storage()._cdata != base.untyped_storage()._cdata:
        raise _Unkeyable
    return (
        output.shape,
        output.stride(),
        output.dtype,
        output.fake_device,
        output.storage_offset(),
    )


class OutputMemo:
    """Per fake mode: ``lookup`` before an operation runs, ``remember`` after it ran; ``hits``
    counts the operations it answered."""

    def __init__(self, mode: _fake.FakeTensorMode) -> None:
        self._mode = mode
        self.hits = 0
        self._funcs: dict[Any, int | bool] = {}
        self._outputs: dict[Any, tuple[type | None, tuple[_Spec, ...]]] = {}

    def key(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """The call's key, or None where the memo does not answer for it."""
        allowed = self._funcs.get(func)
        if allowed is None:
            allowed = self._funcs[func] = _remembered(func)
        if allowed is False or self._mode.shape_env is not None or _tracing() is not None:
            return None
        try:
            return (func, torch.get_default_dtype(), _key(args), _key(tuple(kwargs.items())))
        except _Unkeyable:
            return None

    def lookup(self, key: Any, func: Any, args: Any) -> Any:
        """The outputs remembered for ``key``, made anew (fresh fake tensors, or a view on the
        aliased argument's storage), or None."""
        found = self._outputs.get(key)
        if found is None:
            return None
        container, specs = found
        self.hits += 1
        base = self._funcs[func]
        if base is not True:
            return self._viewed(specs[0], args[base])
        outputs = [None if s is None else self._made(s) for s in specs]
        return outputs[0] if container is None else container(outputs)

    def remember(
        self, key: Any, func: Any, args: Any, result: Any, inputs: list[torch.Tensor]
    ) -> None:
        """Keep ``result``'s metadata for ``key`` (``inputs``: the call's tensors); an
        operation whose outputs are not as its schema promises (fresh, or a view of its
        argument) is never keyed again."""
        base = self._funcs[func]
        try:
            if base is not True:
                entry = (None, (_view(result, args[base] if base < len(args) else None),))
            elif type(result) in (tuple, list):
                entry = (type(result), tuple(_fresh(r, inputs) for r in result))
            else:
                entry = (None, (_fresh(result, inputs),))
        except _Unkeyable:
            self._funcs[func] = False
            return
        self._outputs[key] = entry

    def _made(self, spec: tuple[Any, ...]) -> torch.Tensor:
        shape, stride, dtype, device, requires_grad = spec
        meta = torch.empty_strided(
            shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad
        )
        return _fake.FakeTensor(self._mode, meta, device)

    def _viewed(self, spec: tuple[Any, ...], base: torch.Tensor) -> torch.Tensor:
        shape, stride, dtype, device, offset = spec
        meta = torch.empty(0, dtype=dtype, device="meta")
        meta.set_(base.untyped_storage(), offset, shape, stride)
        return _fake.FakeTensor(self._mode, meta, device)
