"""The options the commands share, declared once: the option helper, the option types, and the
settings that the shared options make."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from cl_audit.enums import Amp, DType, Optimizer
from cl_audit.execution.settings import AuditSettings, CompileOptions, parse_input_size

__all__ = [
    "CACHE_MAX_FLAG",
    "MODELS_HELP",
    "NAMES_HELP",
    "CompileDynamic",
    "audit_settings",
    "compile_options",
    "given",
    "opt",
]


def opt(metavar: str | None, help: str, *names: str, **more: Any) -> Any:
    """An option shown as ``--name METAVAR`` (None: its choices) with a one-line help; a bool
    given one name is a switch, off unless given."""
    return typer.Option(*names, help=help, metavar=metavar, **more)


MODELS_HELP = "torchvision names or globs, or module:factory / path/file.py:factory."
NAMES_HELP = "%s names, globs or 'all' (several times, or a comma list)."
CACHE_MAX_FLAG = "--cache-max-size"
# Option types: typer needs Optional on Python 3.10.
Patterns = Optional[list[str]]  # noqa: UP045
OptionalPath = Optional[Path]  # noqa: UP045
OptionalPaths = Optional[list[Path]]  # noqa: UP045
OptionalText = Optional[str]  # noqa: UP045
OptionalAmp = Optional[Amp]  # noqa: UP045
OptionalDTypes = Optional[list[DType]]  # noqa: UP045
OptionalInt = Optional[int]  # noqa: UP045
OptionalBool = Optional[bool]  # noqa: UP045
# The options that audit and bench share.
InputSize = Annotated[OptionalText, opt("SIZE", "Per-sample CxHxW or CxTxHxW.")]
BatchSize = Annotated[OptionalInt, opt("N", "Batch size (default 2).", min=1)]
Device = Annotated[str, opt("DEVICE", "torch device.", "--device")]
DTypeOption = Annotated[DType, typer.Option(help="Model and input dtype.")]
OptimizerOption = Annotated[Optimizer, typer.Option(help="With --train.")]


class CompileDynamic(str, Enum):
    """torch.compile's ``dynamic``: None (auto), True, False."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


CompileMode = Annotated[OptionalText, opt("MODE", "torch.compile's mode (default: torch's).")]
CompileBackend = Annotated[str, opt("NAME", "torch.compile's backend.")]
CompileDynamicOption = Annotated[CompileDynamic, opt(None, "torch.compile's dynamic.")]


def compile_options(mode: str | None, backend: str, dynamic: CompileDynamic) -> CompileOptions:
    """The compile options as settings."""
    flag = {CompileDynamic.AUTO: None, CompileDynamic.ON: True, CompileDynamic.OFF: False}
    return CompileOptions(mode, backend, flag[dynamic])


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the option was on the command line (not a default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def audit_settings(
    input_size: str | None,
    batch_size: int | None,
    device: str,
    dtype: DType,
    amp: Amp | None,
    train: bool,
    optimizer: Optimizer,
    **more: Any,
) -> AuditSettings:
    """The options that audits and benches share, with ``more``, as settings: resolved here,
    once; the package plans them, the device resolved before any model is built."""
    return AuditSettings(
        input_size=parse_input_size(input_size) if input_size else None,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        amp=amp,
        train=train,
        optimizer=optimizer,
        **more,
    )
