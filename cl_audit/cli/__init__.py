"""The ``cl-audit`` command: the app, one module per command (its options resolved once into
settings, then its handler), and ``main``, where every outcome and domain error becomes an exit
code (``cl_audit.cli.exits``)."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from cl_audit.cli.audit_command import AUDIT_HELP, audit_command
from cl_audit.cli.bench_command import bench_command
from cl_audit.cli.exits import EXIT_CODES, run_app
from cl_audit.cli.merge_command import merge_command
from cl_audit.cli.ops_command import ops_app
from cl_audit.cli.render_command import render_command
from cl_audit.cli.table_command import table_command
from cl_audit.errors import terminated_as_interrupt

__all__ = ["app", "main"]


class _AuditByDefault(TyperGroup):
    """``cl-audit MODEL ...`` runs the ``audit`` command; ``merge`` is a command of its own."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] != "--help"):
            args = ["audit", *args]
        return super().parse_args(ctx, args)


# Plain click help: it reads at 80 columns (short help strings; the details are in docs/).
app = typer.Typer(cls=_AuditByDefault, rich_markup_mode=None, add_completion=False)


@app.callback(
    help="Find where PyTorch models lose the channels_last memory format.\n\ncl-audit MODEL... "
    "[OPTIONS] audits (see cl-audit audit --help); cl-audit bench MODEL times it in nchw, "
    "channels-last and conv-weights; cl-audit merge combines sweep reports; cl-audit render "
    "turns a saved report into HTML; cl-audit ops indexes every operator's channels_last "
    "behaviour; cl-audit table measures this machine's speed table."
    f"\n\n{EXIT_CODES}"
)
def _help() -> None:
    pass


app.command("audit", help=AUDIT_HELP)(audit_command)
app.command("bench")(bench_command)
app.command("merge")(merge_command)
app.command("render")(render_command)
app.command("table")(table_command)
app.add_typer(ops_app, name="ops")


def main() -> None:
    with terminated_as_interrupt():
        code = run_app(app)
    sys.exit(code)
