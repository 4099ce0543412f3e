"""``cl-audit table``: this machine's operation time table measured (or the tables known
here listed), which predicted speed verdicts read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from cl_audit.cli.console import models_print_to_stderr, wrote
from cl_audit.cli.exits import EXIT, exit_codes
from cl_audit.cli.options import (
    MODELS_HELP,
    BatchSize,
    InputSize,
    OptionalDTypes,
    OptionalInt,
    OptionalPath,
    Patterns,
    opt,
)
from cl_audit.enums import Outcome
from cl_audit.report.files import write_text

if TYPE_CHECKING:
    from cl_audit.features.table.measure import TableRequest

__all__ = ["table", "table_command"]


def table_command(
    device: Annotated[str, opt("DEVICE", "cpu or cuda (mps, xpu: refused).", "--device")] = "cpu",
    dtype: Annotated[
        OptionalDTypes,
        opt(
            "DTYPE",
            "A dtype to measure (repeatable; cpu: float32, cuda: float16 and float32).",
            "--dtype",
        ),
    ] = None,
    budget: Annotated[float, opt("MINUTES", "Measuring time, all parts.", min=0.01)] = 8.0,
    for_models: Annotated[Patterns, opt("MODEL", MODELS_HELP + " Measured first.", "--for")] = None,
    for_timm: Annotated[
        Patterns, opt("NAMES", "timm models, measured first.", "--for-timm")
    ] = None,
    batch_size: BatchSize = None,
    input_size: InputSize = None,
    train: Annotated[bool, opt(None, "--for models' training steps.", "--train")] = False,
    threads: Annotated[
        OptionalInt, opt("N", "torch's CPU threads (part of the identity).", min=1)
    ] = None,
    out: Annotated[OptionalPath, opt("FILE", "Write the table here (default: the cache).")] = None,
    resume: Annotated[bool, opt(None, "Add to the table measured so far.", "--resume")] = False,
    force: Annotated[bool, opt(None, "Measure an existing table anew.", "--force")] = False,
    list_only: Annotated[bool, opt(None, "Print the tables known here.", "--list")] = False,
) -> None:
    """Measure this machine's operation time table, which predicted speed verdicts read: the
    host's cost per operation, the operations around convolutions and a grid of convolutions
    in both layouts (the --for models' own configurations first), within --budget minutes,
    written as it goes to the user's cache folder (CL_AUDIT_TABLES sets another).

    Exit codes: 0 measured (or listed), 2 usage error (a device not here, a table that
    exists without --resume or --force), 130 interrupted (what was measured is kept)."""
    import sys

    import torch

    from cl_audit.execution.settings import parse_input_size
    from cl_audit.features.table.measure import TableRequest
    from cl_audit.sweep.selection import select

    with exit_codes():
        if threads is not None:
            torch.set_num_threads(threads)
        targets = select(list(for_models or ()), list(for_timm or ()), [], [])
        request = TableRequest(
            device=device,
            dtypes=tuple(d.value for d in dtype) if dtype else None,
            budget_s=budget * 60,
            targets=tuple(targets),
            batch_size=batch_size,
            input_size=parse_input_size(input_size) if input_size else None,
            train=train,
            out=out,
            resume=resume,
            force=force,
            command="cl-audit table " + " ".join(sys.argv[2:]),
        )
        interrupted = table(request, list_only, Console())
    raise typer.Exit(EXIT[Outcome.INTERRUPTED] if interrupted else 0)


def table(request: TableRequest, list_only: bool, console: Console) -> bool:
    """Measure this machine's speed table (or, ``list_only``, print the tables known here);
    whether Ctrl-C cut the measuring short (what was measured is kept either way)."""
    from cl_audit.features.table.measure import make_table
    from cl_audit.predict.table_store import store, user_folder
    from cl_audit.render.progress import TableProgress
    from cl_audit.render.table_view import tables_text

    if list_only:
        console.print(tables_text(store()), soft_wrap=True)
        console.print(f"this user's tables: {user_folder()} (CL_AUDIT_TABLES sets another)")
        return False
    with models_print_to_stderr(), TableProgress(console) as progress:
        result = make_table(request, progress, lambda path, text: write_text(path, text, "--out"))
    held = ", ".join(f"{d}: {c} convolutions, {o} probes" for d, (c, o) in result.counts.items())
    state = "complete" if result.complete else "cut short by the budget (--resume adds more)"
    if result.interrupted:
        state = "interrupted: what was measured is kept (--resume goes on)"
    console.print(f"table {result.name}: {held or 'nothing measured'}; {result.seconds:.0f} s "
                  f"measuring; {state}", highlight=False)  # fmt: skip
    if result.counts:
        wrote((result.path,))
    return result.interrupted
