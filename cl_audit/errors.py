"""Domain errors and failure stages; the CLI maps each error to a documented exit code."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from cl_audit.enums import Stage

__all__ = [
    "AuditError",
    "ModelFailedError",
    "Stage",
    "Terminated",
    "UsageError",
    "first_line",
    "mark_failure",
    "marked",
    "terminated_as_interrupt",
]  # fmt: skip

_FAILED_IN = "_cl_audit_failed_in"  # (operation, call site) on an exception, innermost first


class AuditError(RuntimeError):
    """An audit was used wrongly (nested, re-entered, reported before it ran)."""


class UsageError(ValueError):
    """Bad input from the user: an unknown model, a malformed option. Exit code 2."""


class ModelFailedError(RuntimeError):
    """The model failed to build or run. Exit code 3; ``stage`` says where, ``operation`` and
    ``site`` what and which model line (the mark's, else ``site``: the line its traceback
    came from, ``rule.attribution.model_failed``)."""

    def __init__(
        self,
        stage: Stage,
        model: str,
        cause: BaseException,
        hint: str | None = None,
        site: str | None = None,
    ) -> None:
        self.stage = stage
        self.model = model
        self.cause = cause
        self.operation, marked_site = marked(cause)
        self.site = marked_site or site
        self.hint = hint
        message = f"{model}: {stage.value} failed{self._where()}: {first_line(cause)}"
        super().__init__(message.rstrip(": ") + (f" (hint: {hint})" if hint else ""))

    def _where(self) -> str:
        return (f" in {self.operation}" if self.operation else "") + (
            f" at {self.site}" if self.site else ""
        )

    @property
    def detail(self) -> str:
        """What a sweep row says: where it failed, the cause's whole message, and the hint."""
        where = self._where().strip()
        text = f"{type(self.cause).__name__}: {self.cause}".strip()
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{where}: {text}{hint}" if where else f"{text}{hint}"


def mark_failure(error: BaseException, operation: str, site: str | None = None) -> None:
    """Name the operation (and, where the stack cannot, the call site) ``error`` came from; the
    innermost mark stands, so a handler marks on the way out and the first one wins."""
    if not hasattr(error, _FAILED_IN):
        setattr(error, _FAILED_IN, (operation, site))


def marked(error: BaseException) -> tuple[str | None, str | None]:
    """The operation and call site ``error`` was marked with (``mark_failure``), or None."""
    return getattr(error, _FAILED_IN, (None, None))


def first_line(error: BaseException) -> str:
    """``RuntimeError: the first line of its message``."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}"


class Terminated(KeyboardInterrupt):
    """SIGTERM (what CI runners send on a timeout), handled as Ctrl-C is: the partial report
    and the checkpoint are kept (``terminated_as_interrupt``); exit 143 rather than 130."""


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` in the main thread inside (the previous handler back on
    exit); a sweep's forked workers take the default back (``sweep.runner``)."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: left as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
