"""``cl-audit render REPORT --html FILE``: a saved report (any version, model or sweep) as
one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cl_audit.cli.console import wrote
from cl_audit.cli.exits import exit_codes
from cl_audit.cli.options import OptionalPath, opt
from cl_audit.errors import UsageError
from cl_audit.report import SweepReport
from cl_audit.report.files import check_writable, read_ops, read_report

__all__ = ["render", "render_command"]


def render_command(
    report_path: Annotated[Path, typer.Argument(help="A JSON report (.gz too).", metavar="REPORT")],
    html: Annotated[Path, opt("FILE", "Write the HTML report here.", "--html")],
    ops_index: Annotated[
        OptionalPath, opt("FILE", "Link a model's losses to a saved cl-audit ops index.")
    ] = None,
) -> None:
    """Render a saved model or sweep report (any version) as one self-contained HTML file.

    Exit codes: 0 written, 2 unreadable report or index, or unwritable path."""
    with exit_codes():
        render(report_path, html, ops_index)


def render(report_path: Path, html: Path, ops_index: Path | None = None) -> None:
    """A saved report (any version, model or sweep) as one self-contained HTML file; a model's
    linked to the rows of the operator index saved at ``ops_index``."""
    from cl_audit.render.outputs import write_outputs

    check_writable(html, "--html")
    report = read_report(report_path)
    index = None if ops_index is None else read_ops(ops_index)
    if index is not None and isinstance(report, SweepReport):
        raise UsageError(
            "--ops-index links one model's report; for a sweep: "
            "cl-audit ops --index FILE --from-sweep REPORT"
        )
    wrote(write_outputs(report, html=html, index=index))
