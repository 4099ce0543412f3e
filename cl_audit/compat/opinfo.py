"""torch's own operator and module test databases (``OpInfo``'s ``op_db``, ``ModuleInfo``'s
``module_db``), the sources of ``cl-audit ops``: internal APIs (``torch.testing._internal``),
reached here only, behind a probe."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from cl_audit.report.environment import dtype_name

__all__ = [
    "DimArgument",
    "OperatorEntry",
    "Sample",
    "module_entries",
    "operator_entries",
    "opinfo_problem",
]

_MODULE = "torch.testing._internal.common_methods_invocations"
_MODULES = "torch.testing._internal.common_modules"


@dataclass(frozen=True)
class Sample:
    """One call of an operator: its first input and the rest of its arguments (a module's
    sample passes the module and its parameters and buffers first: ``module_entries``)."""

    input: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class DimArgument:
    """An argument of an operator's schema that names dimensions of its input (``dim1``,
    ``start_dim``, ``source``; ``dim`` given as a list): its name, its position among the
    arguments after the input (None where the schemas differ) and its default (None: none)."""

    name: str
    position: int | None
    default: int | tuple[int, ...] | None = None


@dataclass(frozen=True)
class OperatorEntry:
    """An operator of the database: its name (``name.variant``), the call, and its samples on
    a device and dtype (made when asked; making them may raise); its in-place form, whether it
    takes ``out=``, and where its schema takes a dimension: the position of ``dim`` among the
    arguments after the input (None: none, or not at one place in every overload) and whether
    it takes ``keepdim``."""

    name: str
    call: Callable[..., Any]
    samples: Callable[[], Iterator[Sample]]
    inplace: Callable[..., Any] | None = None
    supports_out: bool = False
    dim_position: int | None = None
    keepdim: bool = False
    unsupported: str | None = None  # why it has no samples in this dtype on this device
    dtype: str | None = None  # its samples' own dtype, where it takes none of the index's
    dim_arguments: tuple[DimArgument, ...] = ()


# The dtypes an operator that takes no dtype of the index is judged in, the first it takes.
_OWN = (torch.int64, torch.bool, torch.complex64)


# Schema arguments that name dimensions of the input, moved when a sample is raised (``dims``
# is not among them: ``tile``'s are repetitions).
_DIM_ARGUMENTS = (
    "dim",
    "dim0",
    "dim1",
    "dim2",
    "dimension",
    "start_dim",
    "end_dim",
    "source",
    "destination",
)


@functools.cache
def _schemas(aten_name: str) -> tuple[Any, ...]:
    """The registered schemas of ``aten::aten_name`` (none for an operator torch has not)."""
    try:
        return tuple(torch._C._jit_get_schemas_for_operator(f"aten::{aten_name}"))
    except RuntimeError:
        return ()


@functools.cache
def _dim_arguments(aten_name: str) -> tuple[DimArgument, ...]:
    """The integer arguments of ``aten::aten_name``'s schemas named in ``_DIM_ARGUMENTS``:
    each with its position after the input where every schema that has it agrees, and its
    default where they agree."""
    seen: dict[str, tuple[set[int], set[object]]] = {}
    for schema in _schemas(aten_name):
        for position, argument in enumerate(schema.arguments[1:]):
            if argument.name in _DIM_ARGUMENTS and "int" in str(argument.type):
                positions, defaults = seen.setdefault(argument.name, (set(), set()))
                positions.add(position)
                default = argument.default_value
                defaults.add(tuple(default) if isinstance(default, list) else default)
    return tuple(
        DimArgument(
            name,
            positions.pop() if len(positions) == 1 else None,
            defaults.pop() if len(defaults) == 1 else None,  # type: ignore[arg-type]
        )
        for name, (positions, defaults) in seen.items()
    )


@functools.cache
def _dims(aten_name: str) -> tuple[int | None, bool]:
    """(the position of ``dim`` after the input in every schema of ``aten::aten_name`` that
    has one, or None; whether any takes ``keepdim``), from the registered schemas."""
    schemas = _schemas(aten_name)
    positions = set()
    keepdim = False
    for schema in schemas:
        names = [argument.name for argument in schema.arguments]
        if "dim" in names:
            positions.add(names.index("dim") - 1)
        keepdim = keepdim or "keepdim" in names
    position = positions.pop() if len(positions) == 1 else None
    return (position if position is not None and position >= 0 else None), keepdim


@functools.cache
def opinfo_problem() -> str | None:
    """Why this installation cannot read torch's operator database, or None."""
    quiet = logging.getLogger("torch.utils.cpp_extension")  # "No CUDA runtime is found"
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # torch 2.4 prints hypothesis' absence
            module = importlib.import_module(_MODULE)
            modules = importlib.import_module(_MODULES)
    except ModuleNotFoundError as e:
        return (
            f"torch's operator database ({_MODULE}) needs the {e.name} package: "
            "pip install 'cl-audit[ops]'"
        )
    except Exception as e:  # an internal module of another release: say which, never crash
        return f"torch {torch.__version__}'s operator database does not load: {e}"
    finally:
        quiet.setLevel(level)
    if not isinstance(getattr(module, "op_db", None), list):
        return f"torch {torch.__version__}'s {_MODULE} has no op_db list"
    if not isinstance(getattr(modules, "module_db", None), list):
        return f"torch {torch.__version__}'s {_MODULES} has no module_db list"
    return None


def operator_entries(device: str, dtype: torch.dtype) -> Iterator[OperatorEntry]:
    """Every operator of ``op_db``, in the database's order, with its samples in ``dtype`` on
    ``device``; one that takes no ``dtype`` there with its samples in its own (``_OWN``'s
    first it takes: bitwise operators, complex views), else with the reason
    (``unsupported``). Call ``opinfo_problem`` first."""
    for info in importlib.import_module(_MODULE).op_db:
        name = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        supported = info.supported_dtypes(device)
        own = dtype if dtype in supported else next((d for d in _OWN if d in supported), None)
        if own is None:
            taken = ", ".join(sorted(dtype_name(d) for d in supported)[:4])
            reason = f"takes no {dtype_name(dtype)} on {device}"
            none = f"{reason} ({taken or 'none'})"
            yield OperatorEntry(name, info.op, lambda: iter(()), unsupported=none)
            continue

        def samples(info: Any = info, own: torch.dtype = own) -> Iterator[Sample]:
            for s in info.sample_inputs(device, own, requires_grad=False):
                yield Sample(s.input, tuple(s.args), dict(s.kwargs))

        aten = getattr(info, "aten_name", None) or info.name
        position, keepdim = _dims(aten)
        inplace = getattr(info, "inplace_variant", None)
        out = bool(getattr(info, "supports_out", False))
        other = None if own == dtype else dtype_name(own)
        yield OperatorEntry(
            name,
            info.op,
            samples,
            inplace,
            out,
            position,
            keepdim,
            None,
            other,
            _dim_arguments(aten),
        )


def _module_call(x: Any, module: nn.Module, state: dict[str, Any], *args: Any, **kwargs: Any):
    """``module``'s forward with its parameters and buffers replaced by ``state`` (placed on the
    target device, and made channels_last with the data, as ``module.to(memory_format=...)``)."""
    return functional_call(module, state, (x, *args), kwargs)


def module_entries(device: str, dtype: torch.dtype) -> Iterator[OperatorEntry]:
    """Every module of ``module_db`` that supports ``dtype`` on ``device`` (lazy modules left
    out: once built they are their eager modules), named as the database names it
    (``nn.Conv2d``); a module whose training and evaluation differ twice, evaluating and
    training (``nn.BatchNorm2d.train``). Call ``opinfo_problem`` first."""
    for info in importlib.import_module(_MODULES).module_db:
        if dtype not in info.supported_dtypes(device) or getattr(info, "is_lazy", False):
            continue
        for training in (False, True) if info.train_and_eval_differ else (False,):
            name = info.name + (".train" if training else "")

            def samples(info: Any = info, training: bool = training) -> Iterator[Sample]:
                inputs = info.module_inputs_func(
                    info, device=device, dtype=dtype, requires_grad=False, training=training
                )
                for given in inputs:
                    made = given.constructor_input
                    module = info.module_cls(*made.args, **made.kwargs).to(device, dtype)
                    module.train(training)
                    state = dict(module.named_parameters()) | dict(module.named_buffers())
                    state = {k: v.detach() for k, v in state.items()}
                    forward = given.forward_input
                    if not forward.args:
                        continue
                    first, *rest = forward.args
                    yield Sample(first, (module, state, *rest), dict(forward.kwargs))

            yield OperatorEntry(name, _module_call, samples)
