"""Where the commands print: the terminal report beside a document on stdout, the models' own
prints kept off stdout, and the files written named on stderr."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from rich.console import Console

__all__ = ["console_beside", "models_print_to_stderr", "wrote"]


def console_beside(*outputs: Path | None) -> Console:
    """Where the terminal report goes: stderr when any output document goes to stdout ('-'),
    so that stdout holds that document alone."""
    return Console(stderr=any(o is not None and str(o) == "-" for o in outputs))


def models_print_to_stderr() -> contextlib.AbstractContextManager[object]:
    """What models and their libraries print while they are built and run goes to stderr:
    stdout is cl-audit's (``--json -`` stays pure JSON; Ultralytics announces its settings)."""
    return contextlib.redirect_stdout(sys.stderr)


def wrote(paths: tuple[Path, ...]) -> None:
    """Say on stderr which files were written (not stdout's '-')."""
    for path in paths:
        if str(path) != "-":
            Console(stderr=True).print(f"wrote {path}", highlight=False, soft_wrap=True)
