"""Domain errors and failure stages; the CLI maps each error to a documented exit code."""

from __future__ import annotations

from cl_audit.enums import Stage

__all__ = ["AuditError", "ModelFailedError", "Stage", "UsageError"]


class AuditError(RuntimeError):
    """An audit was used wrongly (nested, re-entered, reported before it ran)."""


class UsageError(ValueError):
    """Bad input from the user: an unknown model, a malformed option. Exit code 2."""


class ModelFailedError(RuntimeError):
    """The model failed to build or run. Exit code 3; ``stage`` says where."""

    def __init__(
        self, stage: Stage, model: str, cause: BaseException, hint: str | None = None
    ) -> None:
        self.stage = stage
        self.model = model
        self.cause = cause
        detail = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        message = f"{model}: {stage.value} failed: {type(cause).__name__}: {detail}".rstrip(": ")
        super().__init__(message + (f" (hint: {hint})" if hint else ""))
