"""The default engine: an aten-level ``TorchDispatchMode``, named by a ``TorchFunctionMode``.

The dispatch mode sees every operator, including those issued by operator dunders (``+``) and
inside composite functions (the clone inside ``flatten``), and changes nothing global. The
function mode only remembers the outermost Python-level call in progress so that each aten
event can be reported as, say, ``torch.cat`` / ``aten.cat``. Torch pops a mode while its handler
runs, so calls nested in ``F.softmax`` are never seen twice and the checker never re-enters.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from torch.autograd.profiler import record_function
from torch.overrides import TorchFunctionMode

from cl_audit.compat.fake_base import Run, device_query
from cl_audit.compat.modes import TorchDispatchMode, function_layer_taken, without_torch_function
from cl_audit.compat.operators import aten_op_name
from cl_audit.compat.profiler_events import recording
from cl_audit.enums import CallLabels
from cl_audit.errors import mark_failure
from cl_audit.fake.mode import dispatch_layer, fake_mode_alone
from cl_audit.intercept.naming import python_op_name
from cl_audit.intercept.observer import Observer
from cl_audit.intercept.signature import call_signature

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
    numbers the calls it checks; with ``first_only`` only the first call of each signature
    (``call_signature``), the profiler recording nothing else: ``repeats`` maps each other
    call to the first of its signature."""

    def __init__(self, observer: Observer, python_calls: _PythonCalls, first_only: bool) -> None:
        super().__init__(observer, python_calls)
        self._calls = 0
        self._first_only = first_only
        self._signatures: dict[Hashable, int] = {}
        self.repeats: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == _METADATA:
            return _metadata(func, args, kwargs)
        self._calls += 1
        call = self._calls
        kwargs = kwargs or {}
        with without_torch_function():  # as the parent's
            if not self._first_only:  # every call labelled: recording stays on
                with record_function(f"{CALL_LABEL}{call}"):
                    result = func(*args, **kwargs)
            elif (first := self._first(func, args, kwargs, call)) is None:
                with recording(True, after=False), record_function(f"{CALL_LABEL}{call}"):
                    result = func(*args, **kwargs)
            else:
                self.repeats[call] = first
                result = func(*args, **kwargs)
            self._observer.observe(func, self._python_calls.current, args, kwargs, result)
        return result

    def _first(self, func: Any, args: Any, kwargs: dict[str, Any], call: int) -> int | None:
        """The first call of this call's signature, None where this is the first (or it has
        none)."""
        signature = call_signature(func, args, kwargs)
        if signature is None:
            return None
        first = self._signatures.setdefault(signature, call)
        return None if first == call else first


class DispatchEngine:
    """Pushes the two modes on ``install`` and pops them, innermost first, on ``uninstall``.
    With ``label_calls`` each operation (``CallLabels.EVERY``; ``True`` too) or the first of
    each signature (``FIRST``: the profiler records nothing else) runs inside a profiler range
    ``CALL_LABEL<n>``, ``n`` being its call number in the recorder (``--time`` matches
    profiler events to findings so; a measured ledger, the copies inside kernels)."""

    name = "dispatch"

    def __init__(
        self,
        observer: Observer,
        *,
        label_calls: bool | CallLabels = False,
        on_python_result: Callable[[object], None] | None = None,
    ) -> None:
        # A training audit's recorder leaves locations on the autograd nodes of each result
        # (``on_python_result``: it sees results after autograd recorded them).
        self._python_calls = _PythonCalls(on_python_result)
        labels = CallLabels.of(label_calls)
        self._observer: _AtenObserver = (
            _AtenObserver(observer, self._python_calls)
            if labels is CallLabels.NONE
            else _LabellingObserver(observer, self._python_calls, labels is CallLabels.FIRST)
        )
        self._labels = labels
        self._entered: list[Any] = []
        self.unwrapped: tuple[str, ...] = ()

    def install(self) -> None:
        """The function mode, then the dispatch mode; inside cl-audit's fake mode with no other
        dispatch mode active, the dispatch mode's work as a layer of the fake mode instead (the
        same place in the order, a dispatch hop less an operation). Where the innermost
        function mode is a function layer of cl-audit's (fake CUDA's attention kernels), the
        function mode does its work in its place, a function hop less a call."""
        fake = None if self._labels is not CallLabels.NONE else fake_mode_alone()
        observer = self._observer if fake is None else dispatch_layer(fake, self._observer.layer)
        taken = function_layer_taken()
        try:
            layer = taken.__enter__()
            self._entered.append(taken)
            self._python_calls.inner = None if layer is None else layer.handle
            modes: list[Any] = [self._python_calls, observer]
            if self._labels is CallLabels.FIRST:
                modes.append(recording(False))  # the profiler records the labelled calls alone
            for mode in modes:
                mode.__enter__()
                self._entered.append(mode)
        except BaseException:
            self.uninstall()
            raise

    @property
    def repeats(self) -> dict[int, int]:
        """Each call not labelled (``CallLabels.FIRST``) -> the first call of its signature."""
        observer = self._observer
        return observer.repeats if isinstance(observer, _LabellingObserver) else {}

    def uninstall(self) -> None:
        while self._entered:
            self._entered[-1].__exit__(None, None, None)
            self._entered.pop()
