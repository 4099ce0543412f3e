"""``cl-audit ops``: every operator's channels_last behaviour (run here, or a saved index),
the operations a sweep's losses cost most, and ``cl-audit ops diff OLD NEW``."""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from cl_audit.cli.console import console_beside, wrote
from cl_audit.cli.exits import exit_codes
from cl_audit.cli.options import DTypeOption, OptionalPath, OptionalPaths, Patterns, opt
from cl_audit.enums import DType, OpBehaviour
from cl_audit.errors import UsageError
from cl_audit.report.files import check_writable, read_ops, read_sweep, write_json, write_text

if TYPE_CHECKING:
    from cl_audit.report.ops_report import OpsIndex

__all__ = ["OpsOutputs", "OpsSources", "ops", "ops_app", "ops_diff"]


ops_app = typer.Typer(rich_markup_mode=None, add_completion=False)


@ops_app.callback(invoke_without_command=True)
def ops_command(
    ctx: typer.Context,
    op: Annotated[Patterns, opt("GLOB", "Only operators matching (repeatable).")] = None,
    loses: Annotated[bool, opt(None, "Only operators that lose or refuse.", "--loses")] = False,
    device: Annotated[
        str, opt("DEVICE", "cpu, or cuda (fake: predicted without a GPU).", "--device")
    ] = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    json_path: Annotated[
        OptionalPath, opt("FILE", "The index as JSON ('-': stdout).", "--json")
    ] = None,
    html_path: Annotated[OptionalPath, opt("FILE", "The index as HTML.", "--html")] = None,
    index_path: Annotated[
        OptionalPath, opt("FILE", "Read a saved index instead.", "--index")
    ] = None,
    from_sweep: Annotated[
        OptionalPaths,
        opt("FILE", "Rank what a sweep's losses cost (repeatable).", "--from-sweep"),
    ] = None,
) -> None:
    """Every operator of torch's own test database given channels_last input, on the CPU or
    CUDA (predicted on fake tensors without a GPU): refuses, loses, other, copies, follows,
    keeps or ambiguous (docs/ops.md); --from-sweep ranks the operations whose losses cost a sweep's
    models most beside their rows; cl-audit ops diff OLD NEW compares two saved indexes.

    Exit codes: 0 printed, 2 usage error (the database cannot load: pip install
    'cl-audit[ops]'; no operator matches)."""
    if ctx.invoked_subcommand is not None:
        return
    with exit_codes():
        console = console_beside(json_path, html_path)
        sources = OpsSources(index_path, tuple(from_sweep or ()))
        outputs = OpsOutputs(json_path, html_path)
        ops(tuple(op or ()), loses, device, dtype, outputs, sources, console)


@ops_app.command("diff")
def ops_diff_command(
    old: Annotated[Path, typer.Argument(help="An index saved with --json.", metavar="OLD")],
    new: Annotated[Path, typer.Argument(help="Another, to compare.", metavar="NEW")],
) -> None:
    """What changed between two saved indexes (a torch release against another): each operator
    whose behaviour differs, worse first.

    Exit codes: 0 compared, 2 unreadable index."""
    with exit_codes():
        ops_diff(old, new, Console())


@dataclass(frozen=True)
class OpsSources:
    """Where ``cl-audit ops`` reads from besides torch: a saved index to use instead of
    running one, and sweep reports whose losses it ranks."""

    index: Path | None = None
    sweeps: tuple[Path, ...] = ()


@dataclass(frozen=True)
class OpsOutputs:
    """Where ``cl-audit ops`` writes the index besides the terminal: JSON ('-': stdout), HTML."""

    json: Path | None = None
    html: Path | None = None


def ops(
    patterns: tuple[str, ...],
    loses: bool,
    device: str,
    dtype: DType,
    outputs: OpsOutputs,
    sources: OpsSources,
    console: Console,
) -> None:
    """The operator coverage index of the installed torch on ``device`` (predicted on fake
    tensors for a CUDA device this machine lacks), or the one saved at ``sources.index``,
    printed (the rows matching ``patterns``; with ``loses`` those that lose channels_last or
    refuse it) and written whole to ``outputs`` (the operators ``patterns`` chose); with
    ``sources.sweeps``, the operations their losses cost most, beside the index's rows."""
    from cl_audit.features.ops_index.probe import select
    from cl_audit.features.ops_index.ranking import rank_costs
    from cl_audit.render.ops_table import render_op_costs, render_ops, render_unjudged

    json_path = outputs.json
    if json_path is not None and str(json_path) != "-":
        check_writable(json_path, "--json")
    if outputs.html is not None:
        check_writable(outputs.html, "--html")
    sweeps = [read_sweep(path) for path in sources.sweeps]
    if sources.index is not None:
        if device != "cpu" or dtype is not DType.FLOAT32:
            raise UsageError("--index reads a saved index: --device and --dtype do not apply")
        index = read_ops(sources.index)
    else:
        index = _run_index(patterns, device, dtype, console)
    wanted = (OpBehaviour.LOSES, OpBehaviour.REFUSES) if loses else ()
    rows = select(index, patterns, wanted)
    unjudged = any(fnmatch.fnmatchcase(u.op, p) for u in index.unjudged for p in patterns)
    if not select(index, patterns) and not unjudged:
        raise UsageError(f"no operator of the index matches {', '.join(patterns)}")
    if sweeps:
        render_op_costs(index, rank_costs(index, sweeps), console)
    else:
        render_ops(index, rows, console)
        render_unjudged(index, patterns, console)
    if json_path is not None:
        write_json(json_path, index, "--json")
        wrote((json_path,))
    if outputs.html is not None:
        from cl_audit.render.html_ops import ops_html

        write_text(outputs.html, ops_html(index), "--html")
        wrote((outputs.html,))


def _run_index(patterns: tuple[str, ...], device: str, dtype: DType, console: Console) -> OpsIndex:
    from cl_audit.compat.opinfo import module_entries, operator_entries, opinfo_problem
    from cl_audit.features.ops_index.probe import build_index
    from cl_audit.features.ops_index.target import target_for

    problem = opinfo_problem()
    if problem is not None:
        raise UsageError(problem)
    target = target_for(device)
    entries = itertools.chain(
        operator_entries("cpu", dtype.torch_dtype), module_entries("cpu", dtype.torch_dtype)
    )
    if patterns:  # only the operators asked for are run
        entries = (e for e in entries if any(fnmatch.fnmatchcase(e.name, p) for p in patterns))
    with console.status("running every operator's samples"):
        return build_index(entries, target, dtype.torch_dtype)


def ops_diff(old: Path, new: Path, console: Console) -> None:
    """The operators whose behaviour differs between two saved indexes, printed."""
    from cl_audit.features.ops_index.diff import diff
    from cl_audit.render.ops_table import render_ops_diff

    before, after = read_ops(old), read_ops(new)
    render_ops_diff(before, after, diff(before, after), console)
