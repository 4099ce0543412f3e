"""What the ``cl-audit`` commands share: the option helper and types, the settings the shared
options make, and the one mapping of domain errors to one-line messages and exit codes."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from cl_audit.enums import Amp, DType, Optimizer, Outcome
from cl_audit.errors import ModelFailedError, Terminated, UsageError
from cl_audit.settings import AuditSettings, parse_input_size

__all__ = [
    "CACHE_MAX_FLAG",
    "EXIT",
    "EXIT_CODES",
    "EXIT_USAGE",
    "MODELS_HELP",
    "NAMES_HELP",
    "as_flags",
    "console_beside",
    "exit_codes",
    "given",
    "opt",
    "run_app",
    "settings_from",
]

EXIT_USAGE = 2
EXIT = {Outcome.CLEAN: 0, Outcome.OFFENDING: 1, Outcome.FAILED: 3, Outcome.INTERRUPTED: 130,
        Outcome.TERMINATED: 143}  # fmt: skip


EXIT_CODES = (
    "Exit codes: 0 clean or minor, 1 offending: channels_last-only copies reach the"
    " gate (--fail-share and --fail-bytes; with --gate speed: channels_last's step slower than"
    " NCHW's by more than --fail-slowdown; with --baseline: new offences, grown costs or"
    " failures), 2 usage error (unknown model, bad option, every model of a sweep skipped; an"
    " installed torch that cannot do what was asked), 3 the model failed to build or run (a"
    " sweep: some model failed and none offended), 130 interrupted (Ctrl-C), 143 terminated"
    " (SIGTERM; a sweep keeps its partial report and checkpoint either way)."
)


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
# The options that audit and bench share, declared once.
InputSize = Annotated[OptionalText, opt("SIZE", "Per-sample CxHxW or CxTxHxW.")]
OptionalInt = Optional[int]  # noqa: UP045
OptionalBool = Optional[bool]  # noqa: UP045
BatchSize = Annotated[OptionalInt, opt("N", "Batch size (default 2).", min=1)]
Device = Annotated[str, opt("DEVICE", "torch device.", "--device")]
DTypeOption = Annotated[DType, typer.Option(help="Model and input dtype.")]
OptimizerOption = Annotated[Optimizer, typer.Option(help="With --train.")]


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the option was on the command line (not a default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


@contextlib.contextmanager
def exit_codes() -> Iterator[None]:
    """Domain errors to their one-line messages and exit codes."""
    try:
        yield
    except UsageError as e:
        raise _fail(as_flags(str(e)), EXIT_USAGE) from None
    except ModelFailedError as e:
        raise _fail(str(e), EXIT[Outcome.FAILED]) from None
    except Terminated:
        raise _fail("terminated (SIGTERM)", EXIT[Outcome.TERMINATED]) from None
    except KeyboardInterrupt:
        raise _fail("interrupted", EXIT[Outcome.INTERRUPTED]) from None


# click's usage error (typer vendors click from 0.29 on: the class is found, not imported)
_CLICK_USAGE = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def run_app(app: typer.Typer) -> int:
    """``app``'s exit code; a usage error that click finds (a value out of range, an unknown
    option or command) as the one line the domain's usage errors are, never click's usage
    block."""
    try:
        code = app(prog_name="cl-audit", standalone_mode=False)
    except _CLICK_USAGE as e:
        where = f" ({e.ctx.command_path} --help)" if e.ctx is not None else ""
        _fail(e.format_message() + where, EXIT_USAGE)
        return EXIT_USAGE
    except typer.Abort:  # Ctrl-C outside a command (its own handler turns it to 130 inside)
        _fail("interrupted", EXIT[Outcome.INTERRUPTED])
        return EXIT[Outcome.INTERRUPTED]
    return code if isinstance(code, int) else 0


def console_beside(*outputs: Path | None) -> Console:
    """Where the terminal report goes: stderr when any output document goes to stdout ('-'),
    so that stdout holds that document alone."""
    return Console(stderr=any(o is not None and str(o) == "-" for o in outputs))


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


_SHARED = ("batch_size", "device", "dtype", "amp", "train", "optimizer")  # and input_size


def settings_from(params: dict[str, Any], **more: Any) -> AuditSettings:
    """The options that audits and benches share (read from the command's parameters), with
    ``more``, as settings; the package plans them, the device resolved once, before any model
    is built."""
    size = params["input_size"]
    shared = {name: params[name] for name in _SHARED}
    # typer before 0.29 hands ctx.params enum options as their values
    shared["dtype"], shared["optimizer"] = DType(shared["dtype"]), Optimizer(shared["optimizer"])
    shared["amp"] = shared["amp"] and Amp(shared["amp"])
    return AuditSettings(input_size=parse_input_size(size) if size else None, **shared, **more)


# The Python API's parameter names, as the core's messages quote them (`name`), and the flags
# that set them here.
_FLAGS = {
    "fail_share": "--fail-share", "fail_bytes": "--fail-bytes", "gate_batch": "--gate-batch",
    "force_layout_opt": "--force-layout-opt", "compile": "--compile", "time": "--time",
    "fake": "--fake", "train": "--train", "table": "--table", "resume": "--resume",
    "force": "--force", "budget": "--budget", "engine": "--engine", "input_size": "--input-size",
    "device": "--device", "rounds": "--rounds", "steps": "--steps", "warmup": "--warmup",
    "gate": "--gate", "fail_slowdown": "--fail-slowdown", "differential": "--differential",
    "convert": "--convert", "amp": "--amp", "dtype": "--dtype", "verify": "--verify",
}  # fmt: skip


def as_flags(message: str) -> str:
    """A core message with the API's parameter names (`fail_share`) as this CLI's flags."""
    return re.sub(r"`(\w+)`", lambda m: _FLAGS.get(m[1], m[1]), message)
