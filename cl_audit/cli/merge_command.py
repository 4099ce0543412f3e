"""``cl-audit merge REPORT... -o FILE``: sweep reports (the shards of a CI matrix) combined
into one, gated on a baseline when one is given."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cl_audit.cli.console import wrote
from cl_audit.cli.exits import EXIT, exit_codes
from cl_audit.cli.options import OptionalPath, opt
from cl_audit.cli.sweeps import gate
from cl_audit.enums import Outcome
from cl_audit.report import merge
from cl_audit.report.files import read_sweep, write_json

__all__ = ["merge_command", "merge_reports"]


def merge_command(
    reports: Annotated[list[Path], typer.Argument(help="Sweep reports.", metavar="REPORT...")],
    output: Annotated[Path, opt("FILE", "Merged report ('-': stdout).", "-o", "--output")],
    force: Annotated[bool, opt(None, "Mix versions; later duplicates win.", "--force")] = False,
    baseline: Annotated[OptionalPath, opt("FILE", "Gate on an earlier sweep JSON.")] = None,
) -> None:
    """Combine sweep reports (the shards of a CI matrix) into one.

    Exit codes: 0 merged (with --baseline: nothing new), 1 with --baseline: new offences or
    failures, 2 unreadable input, mixed versions or duplicate models."""
    with exit_codes():
        outcome = merge_reports(
            reports, output, force=force, baseline=baseline, console=Console(stderr=True)
        )
    raise typer.Exit(EXIT[outcome])


def merge_reports(
    paths: list[Path], output: Path, *, force: bool, baseline: Path | None, console: Console
) -> Outcome:
    """Merge sweep reports into ``output``; with ``baseline``, gate the merged report on it."""
    previous = read_sweep(baseline) if baseline is not None else None
    merged = merge([read_sweep(path) for path in paths], force=force)
    write_json(output, merged, "--output")
    wrote((output,))
    s = merged.summary
    console.print(
        f"merged {len(paths)} reports: {s.models} models, {s.offending} offending, "
        f"{s.failed} failed"
    )
    return Outcome.CLEAN if previous is None else gate(previous, merged, console)
