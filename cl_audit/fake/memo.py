"""The outputs of fake operations, remembered by what decides them: a faster hit than torch's cache.

A fake operation's outputs are decided by the operation, the metadata of its tensors (shape,
strides, dtype, device, storage offset) and its other arguments: no values. Torch's fake mode
caches them too (its dispatch cache), but a hit is slow (a general key
over every argument kind, the output rebuilt under the kernel-invocation guard), most of a fake
training step. ``OutputMemo`` keeps the same answer for the operations
whose outputs are fresh tensors, views of one argument or the arguments they write, and
rebuilds them from their metadata (a view on its argument's storage, as torch's cache does) in
about a third of that (reports/pages/overhead.md), each fake tensor made as torch's
constructor makes it, without the constructor's own cost (``fake_maker``).

Remembered only: builtin (``aten``/``prims``) operations, none tagged as data-dependent,
dynamic-shaped, seeded or in-place-view; views only where one tensor is returned, aliasing one
argument, and no composite kernel decides whether it aliases (torch's cache draws the same
line); in-place and ``out=`` operations where each return is an argument written (or nothing
is returned: the optimizer's ``_foreach_*_``, whose 400-tensor key costs torch 20-30 ms a call)
and the call left every argument's metadata as it was: a hit returns those arguments
themselves, as the kernel does; every tensor argument fake, without a constant, not complex;
every output of the others a fake tensor (or None) on a storage of its own, or a single tensor
on the storage of one argument whatever the schema says (``_unsafe_view``, which torch's cache
refuses), made again on it. Anything else goes to torch's mode, as does every call while a
proxy mode traces or with a shape environment (symbolic shapes).

A key holds each tensor argument's shape, strides, dtype, device and whether it requires grad,
and its storage offset only where the outputs are views or written arguments: a fresh
output's metadata does not depend on where its arguments start in their storages (a training
step's backward adds gradients that are slices of one buffer at many offsets: 2,015 of 2,633
fake additions in the backwards of 40 timm models were answered so instead of faked again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cl_audit.compat.fake_base import FakeTensor, FakeTensorMode, fake_maker, tracing
from cl_audit.compat.operators import composite_implicit, is_overload, schema_of
from cl_audit.compat.storage import storage_key

__all__ = ["MISSING", "OutputMemo"]

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


MISSING = object()  # no outputs remembered (None and () are what void operations return)


class _Unkeyable(Exception):
    """An argument the memo does not key (a real tensor, a symbol, an object)."""


def _key(value: Any, offsets: bool) -> Any:
    """``value``'s part of a key; a tensor's storage offset only with ``offsets``."""
    kind = type(value)
    if kind is FakeTensor:
        if value.constant is not None or value.dtype.is_complex or value.is_sparse:
            raise _Unkeyable
        return (
            value.shape,
            value.stride(),
            value.dtype,
            value.fake_device,
            value.storage_offset() if offsets else None,
            value.requires_grad,
        )
    if kind in _PLAIN:
        return (kind, value)
    if kind is list or kind is tuple:
        return (kind, *[_key(v, offsets) for v in value])
    raise _Unkeyable


class _OnArgument:
    """The kind of an operation whose schema promises fresh outputs, found returning a tensor
    on an argument's storage (``_unsafe_view``): its output's storage offset is its
    argument's, so its key holds the storage offsets (a fresh output's metadata does not
    depend on them: its keys leave them out)."""


_ON_ARGUMENT = _OnArgument()


class _Writes:
    """An in-place or ``out=`` operation: the arguments (position, or name where keyword-only)
    its returns are, in order."""

    def __init__(self, returns: tuple[int | str, ...]) -> None:
        self.returns = returns

    def written(self, args: Any, kwargs: dict[str, Any]) -> list[Any]:
        return [args[r] if isinstance(r, int) else kwargs.get(r) for r in self.returns]


def _writes(schema: Any) -> _Writes | None:
    """The arguments an in-place or ``out=`` operation returns, if each return is one of the
    tensors it writes (or it returns nothing)."""
    written = {}
    for i, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None:
            continue
        if not info.is_write:
            return None  # an argument aliased without being written: not one of these
        written[frozenset(info.before_set)] = argument.name if argument.kwarg_only else i
    returns = []
    for r in schema.returns:
        info = r.alias_info
        if info is None or not info.is_write or str(r.type) != "Tensor":
            return None
        position = written.get(frozenset(info.before_set))
        if position is None:
            return None
        returns.append(position)
    return _Writes(tuple(returns))


def _remembered(func: Any) -> int | bool | _Writes:
    """Whether ``func``'s outputs can be remembered (module docstring): for a view, the
    position of the argument it aliases; for an in-place operation, what it returns."""
    if not is_overload(func) or func.namespace not in _NAMESPACES:
        return False
    if _EXCLUDED_TAGS.intersection(func.tags):
        return False
    schema = schema_of(func)
    aliased = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None]
    returned = [r.alias_info for r in schema.returns]
    if not aliased and not any(returned):
        return True
    if schema.is_mutable:
        return _writes(schema) or False
    if not func.is_view or len(aliased) != 1 or len(returned) != 1 or returned[0] is None:
        return False
    if schema.arguments[aliased[0]].alias_info.is_write or returned[0].is_write:
        return False
    if str(schema.returns[0].type) != "Tensor" or composite_implicit(func):
        return False
    return aliased[0]


def _shared(output: Any, args: Any) -> int | None:
    """The position of the one argument whose storage a single tensor output is on, where
    the schema promised a fresh tensor (``_unsafe_view``); None where it is on none."""
    if type(output) is not FakeTensor:
        return None
    storage = storage_key(output)
    positions = [
        i for i, a in enumerate(args) if type(a) is FakeTensor and storage_key(a) == storage
    ]
    if len(positions) != 1 or output is args[positions[0]]:
        return None
    return positions[0]


def _fresh(output: Any, inputs: list[torch.Tensor]) -> _Spec:
    """A fresh output's metadata; anything else (a view, a constant) is not kept."""
    if output is None:
        return None
    if type(output) is not FakeTensor or output.constant is not None:
        raise _Unkeyable
    storage = storage_key(output)
    if output.storage_offset() or any(storage == storage_key(i) for i in inputs):
        raise _Unkeyable
    return (output.shape, output.stride(), output.dtype, output.fake_device, output.requires_grad)


def _view(output: Any, base: Any) -> _Spec:
    """A view's metadata, with its storage offset: on ``base``'s storage, not requiring grad."""
    if type(output) is not FakeTensor or type(base) is not FakeTensor:
        raise _Unkeyable
    if output.constant is not None or output.requires_grad:
        raise _Unkeyable
    if storage_key(output) != storage_key(base):
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

    def __init__(self, mode: FakeTensorMode) -> None:
        self._mode = mode
        self.hits = 0
        self._funcs: dict[Any, int | bool | _Writes | _OnArgument] = {}
        self._makers: dict[torch.device, Callable[[torch.Tensor], torch.Tensor]] = {}
        self._outputs: dict[Any, Any] = {}  # per key: (container, specs, base) or what it returned

    def key(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """The call's key, or None where the memo does not answer for it."""
        allowed = self._funcs.get(func)
        if allowed is None:
            allowed = self._funcs[func] = _remembered(func)
        if allowed is False or self._mode.shape_env is not None or tracing() is not None:
            return None
        offsets = allowed is not True
        try:
            return (
                func,
                torch.get_default_dtype(),
                _key(args, offsets),
                _key(tuple(kwargs.items()), offsets),
            )
        except _Unkeyable:
            return None

    def aliased(self, func: Any) -> int | None:
        """For a view the memo keeps, the position of the argument it aliases; else None."""
        kind = self._funcs.get(func)
        if kind is None:
            kind = self._funcs[func] = _remembered(func)
        return kind if type(kind) is int else None

    def lookup(self, key: Any, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """The outputs remembered for ``key``, made anew (fresh fake tensors, or a view on the
        aliased argument's storage) or the arguments written, or ``MISSING``."""
        found = self._outputs.get(key, MISSING)
        if found is MISSING:
            return found
        self.hits += 1
        kind = self._funcs[func]
        if isinstance(kind, _Writes):
            written = kind.written(args, kwargs)
            return found if not written else written[0] if len(written) == 1 else tuple(written)
        container, specs, base = found
        if base is not None:
            return self._viewed(specs[0], args[base])
        outputs = [None if s is None else self._made(s) for s in specs]
        return outputs[0] if container is None else container(outputs)

    def remember(
        self,
        key: Any,
        func: Any,
        args: Any,
        kwargs: dict[str, Any],
        result: Any,
        inputs: list[torch.Tensor],
    ) -> None:
        """Keep ``result``'s metadata for ``key`` (``inputs``: the call's tensors, ``kwargs``:
        its keyword arguments); an operation whose outputs are not as the module docstring
        says (fresh, a view of its argument, on one argument's storage, or the arguments it
        wrote, left as they were) is never keyed again."""
        kind = self._funcs[func]
        try:
            if isinstance(kind, _Writes):
                entry = self._written(kind, key, func, args, kwargs, result)
            elif type(kind) is int:
                entry = (None, (_view(result, args[kind] if kind < len(args) else None),), kind)
            elif isinstance(result, (tuple, list)):  # a decomposition's named tuple: a tuple
                container = list if isinstance(result, list) else tuple
                specs = tuple(_fresh(r, inputs) for r in result)
                storages = [storage_key(r) for r in result if r is not None]
                if len(set(storages)) != len(storages):
                    raise _Unkeyable  # two outputs on one storage
                entry = (container, specs, None)
            elif (shared := _shared(result, args)) is not None:
                if kind is True:  # keyed without storage offsets so far: from now on with them
                    self._funcs[func] = _ON_ARGUMENT
                    key = self.key(func, args, kwargs)
                entry = (None, (_view(result, args[shared]),), shared)
            else:
                entry = (None, (_fresh(result, inputs),), None)
        except _Unkeyable:
            self._funcs[func] = False
            return
        self._outputs[key] = entry

    def _written(
        self, kind: _Writes, key: Any, func: Any, args: Any, kwargs: dict[str, Any], result: Any
    ) -> Any:
        """What an in-place call returned, where it is the arguments it wrote (or nothing) and
        every argument's metadata is as it was before the call (the key has them)."""
        written = kind.written(args, kwargs)
        if not written:
            if result not in (None, ()):
                raise _Unkeyable
        elif len(written) == 1:
            if result is not written[0]:
                raise _Unkeyable
        elif type(result) is not tuple or any(
            r is not w for r, w in zip(result, written, strict=True)
        ):
            raise _Unkeyable
        if self.key(func, args, kwargs) != key:
            raise _Unkeyable  # the call changed an argument's metadata
        return result if not written else None

    def _made(self, spec: tuple[Any, ...]) -> torch.Tensor:
        shape, stride, dtype, device, requires_grad = spec
        meta = torch.empty_strided(
            shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad
        )
        return self.wrap(meta, device)

    def _viewed(self, spec: tuple[Any, ...], base: torch.Tensor) -> torch.Tensor:
        shape, stride, dtype, device, offset = spec
        meta = torch.empty(0, dtype=dtype, device="meta")
        meta.set_(base.untyped_storage(), offset, shape, stride)
        return self.wrap(meta, device)

    def wrap(self, meta: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A fake tensor of the mode on ``device`` laid out as ``meta``, as torch's constructor
        makes it, by ``fake_maker``'s faster path."""
        maker = self._makers.get(device)
        if maker is None:
            maker = self._makers[device] = fake_maker(self._mode, device)
        return maker(meta)
