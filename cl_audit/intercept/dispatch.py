"""The default engine: an aten-level ``TorchDispatchMode``, named by a ``TorchFunctionMode``.

The dispatch mode sees every operator, including those issued by operator dunders (``+``) and
inside composite functions (the clone inside ``flatten``), and changes nothing global. The
function mode only remembers the outermost Python-level call in progress so that each aten
event can be reported as, say, ``torch.cat`` / ``aten.cat``. Torch pops a mode while its handler
runs, so calls nested in ``F.softmax`` are never seen twice and the checker never re-enters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.autograd.profiler import record_function
from torch.overrides import TorchFunctionMode

from cl_audit.compat.fake_base import Run, device_query
from cl_audit.compat.fake_mode import dispatch_layer, fake_mode_alone
from cl_audit.compat.modes import TorchDispatchMode, function_layer_taken, without_torch_function
from cl_audit.compat.operators import aten_op_name
from cl_audit.errors import mark_failure
from cl_audit.intercept.naming import python_op_name
from cl_audit.intercept.observer import Observer

__all__ = ["CALL_LABEL", "DispatchEngine"]

CALL_LABEL = "cl_audit#"
_METADATA = "prim"  # the namespace of operators that read a tensor's metadata: nothing to check


def _called(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    return func(*args, **kwargs)


def _metadata(func: Any, args: Any, kwargs: Any, run: Run = _called) -> Any:
    """A metadata query's answer: a fake tensor's device from the tensor, any other passed on
    (by ``run``)."""
    device = device_query(func, args)
    return device if device is not None else run(func, args, kwargs or {})


class _PythonCalls(TorchFunctionMode):
    """Remembers the Python-level torch callable currently running, and hands each result to
    ``on_result`` (it sees results after autograd recorded them, unlike the dispatch mode).
    ``inner``, where set, passes a call on through the work of the function layer below it
    (``function_layer_taken``); else the call is made here."""

    def __init__(self, on_result: Callable[[object], None] | None = None) -> None:
        super().__init__()
        self.current: object = None
        self._on_result = on_result
        self.inner: Run | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        outer = self.current
        self.current = func
        try:
            inner = self.inner
            if inner is None:
                result = func(*args, **(kwargs or {}))
            else:
                result = inner(func, args, kwargs or {})
        except Exception as e:
            mark_failure(e, python_op_name(func))
            raise
        finally:
            self.current = outer
        if self._on_result is not None:
            with without_torch_function():
                self._on_result(result)
        return result


class _AtenObserver(TorchDispatchMode):
    def __init__(self, observer: Observer, python_calls: _PythonCalls) -> None:
        super().__init__()
        self._observer = observer
        self._python_calls = python_calls

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.layer(func, args, kwargs or {}, _called)

    def layer(self, func: Any, args: Any, kwargs: dict[str, Any], run: Run) -> Any:
        """The mode's work, with ``run`` passing the operation on: as a mode, calling it; as
        a layer of cl-audit's fake mode (``dispatch_layer``), to the layers below."""
        if func.namespace == _METADATA:
            return _metadata(func, args, kwargs, run)
        # Neither the operator passed on nor the observer's reads are calls of the model: no
        # torch function mode (the model's, or cl-audit's own) is handed them.
        with without_torch_function():
            try:
                result = run(func, args, kwargs)
            except Exception as e:
                mark_failure(e, aten_op_name(func))
                raise
            self._observer.observe(func, self._python_calls.current, args, kwargs, result)
        return result


class _LabellingObserver(_AtenObserver):
    """Each call inside a profiler range named by its number (1, 2, ...), as the recorder
    numbers the calls it checks."""

    def __init__(self, observer: Observer, python_calls: _PythonCalls) -> None:
        super().__init__(observer, python_calls)
        self._calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == _METADATA:
            return _metadata(func, args, kwargs)
        self._calls += 1
        with without_torch_function():  # as the parent's
            with record_function(f"{CALL_LABEL}{self._calls}"):
                result = func(*args, **(kwargs or {}))
            self._observer.observe(func, self._python_calls.current, args, kwargs, result)
        return result


class DispatchEngine:
    """Pushes the two modes on ``install`` and pops them, innermost first, on ``uninstall``.
    With ``label_calls`` each operation runs inside a profiler range ``CALL_LABEL<n>``, ``n``
    being its call number in the recorder (``--time`` matches profiler events to findings so)."""

    name = "dispatch"

    def __init__(
        self,
        observer: Observer,
        *,
        label_calls: bool = False,
        on_python_result: Callable[[object], None] | None = None,
    ) -> None:
        # A training audit's recorder leaves locations on the autograd nodes of each result
        # (``on_python_result``: it sees results after autograd recorded them).
        self._python_calls = _PythonCalls(on_python_result)
        aten = _LabellingObserver if label_calls else _AtenObserver
        self._observer = aten(observer, self._python_calls)
        self._labelling = label_calls
        self._entered: list[Any] = []
        self.unwrapped: tuple[str, ...] = ()

    def install(self) -> None:
        """The function mode, then the dispatch mode; inside cl-audit's fake mode with no other
        dispatch mode active, the dispatch mode's work as a layer of the fake mode instead (the
        same place in the order, a dispatch hop less an operation). Where the innermost
        function mode is a function layer of cl-audit's (fake CUDA's attention kernels), the
        function mode does its work in its place, a function hop less a call."""
        fake = None if self._labelling else fake_mode_alone()
        observer = self._observer if fake is None else dispatch_layer(fake, self._observer.layer)
        taken = function_layer_taken()
        try:
            layer = taken.__enter__()
            self._entered.append(taken)
            self._python_calls.inner = None if layer is None else layer.handle
            for mode in (self._python_calls, observer):
                mode.__enter__()
                self._entered.append(mode)
        except BaseException:
            self.uninstall()
            raise

    def uninstall(self) -> None:
        while self._entered:
            self._entered[-1].__exit__(None, None, None)
            self._entered.pop()
