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

__all__ = ["OperatorEntry", "Sample", "module_entries", "operator_entries", "opinfo_problem"]

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
class OperatorEntry:
    """An operator of the database: its name (``name.variant``), the call, and its samples on
    a device and dtype (made when asked; making them may raise)."""

    name: str
    call: Callable[..., Any]
    samples: Callable[[], Iterator[Sample]]


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
    """Every operator of ``op_db`` that supports ``dtype`` on ``device``, in the database's
    order; call ``opinfo_problem`` first."""
    for info in importlib.import_module(_MODULE).op_db:
        if dtype not in info.supported_dtypes(device):
            continue
        name = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")

        def samples(info: Any = info) -> Iterator[Sample]:
            for s in info.sample_inputs(device, dtype, requires_grad=False):
                yield Sample(s.input, tuple(s.args), dict(s.kwargs))

        yield OperatorEntry(name, info.op, samples)


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
