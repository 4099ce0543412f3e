"""The classic engine: wrap the public callables of ``torch``, ``torch.Tensor`` and ``F``.

Done right where the memory-format tutorial's snippet is not: operator dunders are wrapped;
metadata callables, classes and typing objects are left alone; a callable that refuses to be
replaced is listed, not fatal; and ``uninstall`` puts back exactly the objects that were there
(deleting the entries it added to ``vars(torch.Tensor)`` for inherited methods), also when it
is interrupted half-way. Only the outermost wrapped call is checked, so ``F.softmax`` calling
``Tensor.softmax`` is one event and the checker's own tensor calls pass straight through.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from inspect import getattr_static
from typing import Any

import torch
import torch.nn.functional as F

from cl_audit.enums import CallLabels
from cl_audit.errors import AuditError
from cl_audit.intercept.observer import Observer

__all__ = ["METADATA_METHODS", "OPERATOR_DUNDERS", "PatchEngine", "patch_targets"]

OPERATOR_DUNDERS = frozenset(
    f"__{op}__"
    for base in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
        "and", "or", "xor", "lshift", "rshift",
    )
    for op in (base, f"r{base}", f"i{base}")
) | frozenset(
    ["__neg__", "__pos__", "__abs__", "__invert__", "__getitem__", "__setitem__",
     "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"]
)  # fmt: skip

METADATA_METHODS = frozenset(
    [
        "stride", "size", "dim", "ndimension", "is_contiguous", "data_ptr", "storage_offset",
        "numel", "nelement", "element_size", "untyped_storage", "storage", "get_device",
        "dim_order", "is_floating_point", "is_complex", "is_signed", "is_set_to", "is_shared",
        "is_pinned", "is_inference", "is_nonzero", "has_names", "item", "tolist", "numpy",
        "register_hook", "register_post_accumulate_grad_hook", "backward", "retain_grad",
        "requires_grad_",
    ]
)  # fmt: skip

# Torch-function machinery that every F function calls, and torch's state queries and setters.
_MACHINERY = frozenset(
    ["has_torch_function", "has_torch_function_unary", "has_torch_function_variadic",
     "handle_torch_function", "boolean_dispatch", "typename", "compile", "load", "save",
     "manual_seed", "seed", "initial_seed"]
)  # fmt: skip
_STATE_PREFIXES = ("is_", "get_", "set_", "use_", "are_")

_WRAPPABLE = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
)


@dataclass(frozen=True)
class _Target:
    owner: Any
    name: str
    label: str  # user-facing name, e.g. "Tensor.__add__"


def patch_targets() -> Iterator[_Target]:
    """Every attribute the patch engine replaces, in a stable order."""
    for owner, prefix in ((torch, "torch"), (F, "F")):
        for name, value in list(vars(owner).items()):
            if (
                name.startswith("_")
                or name in _MACHINERY
                or name.startswith(_STATE_PREFIXES)
                or not isinstance(value, (types.FunctionType, types.BuiltinFunctionType))
            ):
                continue
            yield _Target(owner, name, f"{prefix}.{name}")
    for name in sorted(dir(torch.Tensor)):
        public = not name.startswith("_")
        if not (public or name in OPERATOR_DUNDERS) or name in METADATA_METHODS:
            continue
        if isinstance(getattr_static(torch.Tensor, name), _WRAPPABLE):
            yield _Target(torch.Tensor, name, f"Tensor.{name}")


class _State:
    busy = False


@dataclass(frozen=True)
class _Saved:
    owner: Any
    name: str
    own_entry: bool  # False: the name was inherited and the wrapper added a new entry
    original: Any


class PatchEngine:
    """Replaces each target with a checking wrapper; ``uninstall`` restores by identity."""

    name = "patch"

    def __init__(
        self,
        observer: Observer,
        *,
        label_calls: bool | CallLabels = False,
        on_python_result: Callable[[object], None] | None = None,
    ) -> None:
        labelled = CallLabels.of(label_calls) is not CallLabels.NONE
        if labelled or on_python_result is not None:  # check_engine refuses these first
            raise AuditError("the patch engine neither labels calls nor attributes backward")
        self._observer = observer
        self._state = _State()
        self._saved: list[_Saved] = []
        self.unwrapped: tuple[str, ...] = ()

    def install(self) -> None:
        refused: list[str] = []
        try:
            for target in patch_targets():
                owner, name = target.owner, target.name
                own = name in vars(owner)
                saved = _Saved(owner, name, own, vars(owner)[name] if own else None)
                wrapper = self._wrap(target.label, getattr(owner, name))
                try:
                    setattr(owner, name, wrapper)
                except (AttributeError, TypeError) as e:
                    refused.append(f"{target.label}: {e}")
                    continue
                self._saved.append(saved)
        except BaseException:
            self.uninstall()
            raise
        self.unwrapped = tuple(refused)

    def uninstall(self) -> None:
        """Restore newest first; re-entrant, so an interrupt part-way loses nothing."""
        interrupted: BaseException | None = None
        while self._saved:
            try:
                while self._saved:
                    saved = self._saved[-1]
                    if saved.own_entry:
                        setattr(saved.owner, saved.name, saved.original)
                    elif saved.name in vars(saved.owner):
                        delattr(saved.owner, saved.name)
                    self._saved.pop()
            except KeyboardInterrupt as e:
                interrupted = e
        if interrupted is not None:
            raise interrupted

    def _wrap(self, label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        state = self._state
        observe = self._observer.observe

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if state.busy:
                return original(*args, **kwargs)
            state.busy = True
            try:
                result = original(*args, **kwargs)
                observe(None, label, args, kwargs, result)
                return result
            finally:
                state.busy = False

        wrapper.__name__ = getattr(original, "__name__", label)
        wrapper.__qualname__ = getattr(original, "__qualname__", label)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper._cl_audit_wrapper = True  # type: ignore[attr-defined]  # lets tests find leftovers
        return wrapper
