"""Where the commands print and write: the audit's outputs, the terminal report beside a
document on stdout, the models' own prints kept off stdout, and the files written named on
stderr."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from cl_audit.report.files import check_writable

__all__ = ["AuditOutputs", "console_beside", "models_print_to_stderr", "wrote"]


@dataclass(frozen=True)
class AuditOutputs:
    """Where an audit writes (JSON, HTML, JUnit, a sweep's checkpoint), the operator index one
    model's report is linked to, and the earlier sweep a sweep is gated on."""

    json: Path | None = None
    html: Path | None = None
    junit: Path | None = None
    checkpoint: Path | None = None
    ops_index: Path | None = None  # a saved operator index one model's report is linked to
    baseline: Path | None = None  # an earlier sweep a sweep is gated on

    def check(self) -> None:
        """Refuse an unwritable path before any model runs."""
        for path, option in ((self.json, "--json"), (self.junit, "--junit"), (self.html, "--html")):
            check_writable(path, option)


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
