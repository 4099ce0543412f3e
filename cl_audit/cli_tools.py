"""The ``cl-audit`` commands beside the audit: ``bench``, ``ops`` (and ``ops diff``), ``merge``,
``render`` and ``table``; ``cl_audit.cli`` registers them on its app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cl_audit import commands, commands_tools
from cl_audit.cli_options import (
    EXIT,
    MODELS_HELP,
    BatchSize,
    Device,
    DTypeOption,
    InputSize,
    OptimizerOption,
    OptionalAmp,
    OptionalDTypes,
    OptionalInt,
    OptionalPath,
    OptionalPaths,
    OptionalText,
    Patterns,
    console_beside,
    exit_codes,
    opt,
    settings_from,
)
from cl_audit.enums import DType, Optimizer, Outcome

__all__ = ["bench_command", "merge_command", "ops_app", "render_command", "table_command"]


def bench_command(
    ctx: typer.Context,
    model: Annotated[OptionalText, typer.Argument(help=MODELS_HELP, metavar="MODEL")] = None,
    timm_model: Annotated[OptionalText, opt("NAME", "A timm model.", "--timm")] = None,
    input_size: InputSize = None,
    batch_size: BatchSize = None,
    device: Device = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    amp: Annotated[OptionalAmp, opt(None, "Also time every strategy under autocast.")] = None,
    train: Annotated[bool, opt(None, "Time training steps, not inference.", "--train")] = False,
    optimizer: OptimizerOption = Optimizer.SGD,
    rounds: Annotated[int, opt("N", "Alternating rounds.", min=1)] = 7,
    warmup: Annotated[int, opt("N", "Least warm-up steps.", min=0)] = 3,
    steps: Annotated[int, opt("N", "Steps timed per round.", min=1)] = 3,
    threads: Annotated[OptionalInt, opt("N", "torch intra-op threads.", min=1)] = None,
    attribute: Annotated[bool, typer.Option(help="Time the channels-last findings.")] = True,
    json_path: Annotated[OptionalPath, opt("FILE", "Bench JSON ('-': stdout).", "--json")] = None,
    dashboard_json: Annotated[OptionalPath, opt("FILE", "PyTorch OSS benchmark records.")] = None,
) -> None:
    """Time a model in nchw, channels-last and conv-weights, then its channels-last findings.

    Exit codes: 0 benched, 2 usage error, 3 the model failed to build or run, 130 interrupted."""
    from cl_audit.features.bench import BenchSettings

    console = console_beside(json_path, dashboard_json)
    with exit_codes():
        settings = BenchSettings(
            settings_from(ctx.params),
            rounds=rounds,
            warmup=warmup,
            steps_per_round=steps,
            threads=threads,
            attribute=attribute,
        )
        commands_tools.bench(model, timm_model, settings, json_path, dashboard_json, console)


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
        sources = commands_tools.OpsSources(index_path, tuple(from_sweep or ()))
        outputs = commands_tools.OpsOutputs(json_path, html_path)
        commands_tools.ops(tuple(op or ()), loses, device, dtype, outputs, sources, console)


@ops_app.command("diff")
def ops_diff_command(
    old: Annotated[Path, typer.Argument(help="An index saved with --json.", metavar="OLD")],
    new: Annotated[Path, typer.Argument(help="Another, to compare.", metavar="NEW")],
) -> None:
    """What changed between two saved indexes (a torch release against another): each operator
    whose behaviour differs, worse first.

    Exit codes: 0 compared, 2 unreadable index."""
    with exit_codes():
        commands_tools.ops_diff(old, new, Console())


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
        outcome = commands.merge_reports(
            reports, output, force=force, baseline=baseline, console=Console(stderr=True)
        )
    raise typer.Exit(EXIT[outcome])


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
        commands_tools.render(report_path, html, ops_index)


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

    from cl_audit.features.table.measure import TableRequest
    from cl_audit.settings import parse_input_size
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
        interrupted = commands_tools.table(request, list_only, Console())
    raise typer.Exit(EXIT[Outcome.INTERRUPTED] if interrupted else 0)
