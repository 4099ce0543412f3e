"""What the engines hand each intercepted operation to: an ``Observer``. The recorder of an
audit is one; the NCHW run's counterpart watcher (``cl_audit.differential``) is another."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Observer"]


class Observer(Protocol):
    """Called once per intercepted operation, after it ran."""

    def observe(
        self, aten_op: object, python_op: object, args: Any, kwargs: Any, result: Any
    ) -> None: ...
