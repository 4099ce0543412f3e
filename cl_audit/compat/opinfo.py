"""torch's own operator test database (``OpInfo``'s ``op_db``), the source of ``cl-audit ops``:
an internal API (``torch.testing._internal``), reached here only, behind a probe."""

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

__all__ = ["OperatorEntry", "Sample", "operator_entries", "opinfo_problem"]

_MODULE = "torch.testing._internal.common_methods_invocations"


@dataclass(frozen=True)
class Sample:
    """One call of an operator: its first input and the rest of its arguments."""

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
