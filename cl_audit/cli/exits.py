"""The one mapping of outcomes and domain errors to exit codes and one-line messages, and of
the Python API's parameter names to this CLI's flags."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import typer
from rich.console import Console

from cl_audit.enums import Outcome
from cl_audit.errors import ModelFailedError, Terminated, UsageError

__all__ = ["EXIT", "EXIT_CODES", "EXIT_USAGE", "as_flags", "exit_codes", "fail", "run_app"]

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


@contextlib.contextmanager
def exit_codes() -> Iterator[None]:
    """Domain errors to their one-line messages and exit codes."""
    try:
        yield
    except UsageError as e:
        raise fail(as_flags(str(e)), EXIT_USAGE) from None
    except ModelFailedError as e:
        raise fail(str(e), EXIT[Outcome.FAILED]) from None
    except Terminated:
        raise fail("terminated (SIGTERM)", EXIT[Outcome.TERMINATED]) from None
    except KeyboardInterrupt:
        raise fail("interrupted", EXIT[Outcome.INTERRUPTED]) from None


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
        fail(e.format_message() + where, EXIT_USAGE)
        return EXIT_USAGE
    except typer.Abort:  # Ctrl-C outside a command (its own handler turns it to 130 inside)
        fail("interrupted", EXIT[Outcome.INTERRUPTED])
        return EXIT[Outcome.INTERRUPTED]
    return code if isinstance(code, int) else 0


def fail(message: str, code: int) -> typer.Exit:
    """Print ``message`` as the one error line on stderr; the exit to raise with ``code``."""
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


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
