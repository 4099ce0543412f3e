"""What the engines hand each intercepted operation to: an ``Observer``. The recorder of an
audit is one; the NCHW run's counterpart watcher (``cl_audit.compare.differential``) is another."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Observer", "Tee"]


class Observer(Protocol):
    """Called once per intercepted operation, after it ran."""

    def observe(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None: ...


class Tee:
    """Hands each operation to two observers, in order."""

    def __init__(self, first: Observer, second: Observer) -> None:
        self._first, self._second = first, second

    def observe(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None:
        self._first.observe(aten_op, python_op, args, kwargs, result)
        self._second.observe(aten_op, python_op, args, kwargs, result)
