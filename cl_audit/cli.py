"""The ``cl-audit`` command: options parsed into settings at the boundary, one call into the
package, and the one place where domain errors become exit codes (``EXIT_CODES``)."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from cl_audit import commands
from cl_audit.cli_options import (
    CACHE_MAX_FLAG,
    EXIT,
    EXIT_CODES,
    MODELS_HELP,
    NAMES_HELP,
    BatchSize,
    Device,
    DTypeOption,
    InputSize,
    OptimizerOption,
    OptionalAmp,
    OptionalBool,
    OptionalPath,
    OptionalText,
    Patterns,
    console_beside,
    exit_codes,
    given,
    opt,
    run_app,
    settings_from,
)
from cl_audit.cli_tools import (
    bench_command,
    merge_command,
    ops_app,
    render_command,
    table_command,
)
from cl_audit.enums import DType, Engine, GateOn, Optimizer, Strategy, TensorMode
from cl_audit.errors import terminated_as_interrupt
from cl_audit.report.verdict import GATE_BATCH, Gate
from cl_audit.settings import parse_size
from cl_audit.sweep.api import CacheOptions
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.worker import SweepSettings, parse_memory

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


class _Convert(str, Enum):
    """The strategies an audit can describe (``Strategy`` names them all)."""

    CHANNELS_LAST = Strategy.CHANNELS_LAST.value
    CONV_WEIGHTS = Strategy.CONV_WEIGHTS.value


@app.command(
    "audit",
    help="Find the operations where a model's forward pass loses the channels_last format.\n\n"
    "Each model gets random weights and a random input; model and input are converted to "
    "channels_last (channels_last_3d for 5D), in eval mode under no_grad. One model prints its "
    "offenders; several (or --junit, --baseline, --shard, --resume, --cache) make a sweep, each "
    f"model in a worker of its own.\n\n{EXIT_CODES}",
)
def audit_command(
    ctx: typer.Context,
    models: Annotated[Patterns, typer.Argument(help=MODELS_HELP, metavar="MODEL...")] = None,
    timm: Annotated[Patterns, opt("NAMES", NAMES_HELP % "timm", "--timm")] = None,
    torchvision: Annotated[Patterns, opt("NAMES", NAMES_HELP % "torchvision")] = None,
    exclude: Annotated[Patterns, opt("GLOBS", "Drop models matching these globs.")] = None,
    list_only: Annotated[bool, opt(None, "Print the selection and exit.", "--list")] = False,
    input_size: InputSize = None,
    batch_size: BatchSize = None,
    device: Device = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    amp: Annotated[OptionalAmp, opt(None, "Run under autocast with this dtype.")] = None,
    engine: Annotated[Engine, opt(None, "dispatch (aten level) or patch.")] = Engine.DISPATCH,
    fake: Annotated[bool, opt(None, "Fake tensors: a prediction, fast.", "--fake")] = False,
    differential: Annotated[bool, typer.Option(help="Weigh the cost against NCHW.")] = True,
    fail_share: Annotated[float, opt("PCT", "Offend at this % of bytes written...", min=0)] = 1.0,
    fail_bytes: Annotated[str, opt("SIZE", "...and this many extra bytes.")] = "1MiB",
    gate_batch: Annotated[int, opt("N", "...projected to this batch.", min=1)] = GATE_BATCH,
    gate: Annotated[GateOn, opt(None, "Exit 1 on too many bytes, or on a slower step.")] = (
        GateOn.BYTES
    ),
    fail_slowdown: Annotated[
        float, opt("PCT", "Speed: within this %, no difference.", min=0)
    ] = 5.0,
    train: Annotated[bool, opt(None, "Audit a training step, not inference.", "--train")] = False,
    ddp: Annotated[bool, opt(None, "With --train: also the step under DDP.", "--ddp")] = False,
    fsdp: Annotated[bool, opt(None, "With --train: also the FSDP pre-flight.", "--fsdp")] = False,
    optimizer: OptimizerOption = Optimizer.SGD,
    convert: Annotated[_Convert, opt(None, "What is converted.")] = _Convert.CHANNELS_LAST,
    time: Annotated[bool, opt(None, "Time the step and the flagged ops.", "--time")] = False,
    speed_table: Annotated[
        OptionalText, opt("NAME|FILE", "Predict speed with this table.", "--table")
    ] = None,
    compile_: Annotated[bool, opt(None, "Also Inductor's layout decisions.", "--compile")] = False,
    force_layout_opt: Annotated[bool, opt(None, "Also forced.", "--force-layout-opt")] = False,
    show_all: Annotated[bool, opt(None, "Parameter and neutral losses too.", "--show-all")] = False,
    verify: Annotated[
        OptionalBool,
        opt(None, "Try remedies in what-if runs (one model: on).", "--verify/--no-verify"),
    ] = None,
    confirm: Annotated[bool, opt(None, "With --fake: eager re-run.", "--confirm")] = False,
    json_path: Annotated[OptionalPath, opt("FILE", "JSON report ('-': stdout).", "--json")] = None,
    html: Annotated[OptionalPath, opt("FILE", "Self-contained HTML report.")] = None,
    ops_index: Annotated[
        OptionalPath, opt("FILE", "Link the losses to a saved cl-audit ops index.")
    ] = None,
    jobs: Annotated[int, opt("N", "Sweep: models at once.", min=1)] = 2,
    timeout: Annotated[float, opt("S", "Sweep: seconds per model.", min=1)] = 300.0,
    max_memory: Annotated[str, opt("SIZE", "Sweep: memory cap per model.")] = "4GB",
    max_input_size: Annotated[int, opt("PX", "Sweep: cap on input sides.", min=1)] = 256,
    shard_spec: Annotated[OptionalText, opt("K/N", "Sweep: this shard.", "--shard")] = None,
    checkpoint: Annotated[OptionalPath, opt("FILE", "Sweep: rows so far (JSON Lines).")] = None,
    resume: Annotated[bool, opt(None, "Sweep: skip checkpointed models.", "--resume")] = False,
    cache: Annotated[OptionalPath, opt("DIR", "Sweep: reuse unchanged rows kept here.")] = None,
    cache_failures: Annotated[
        bool, opt(None, "Reuse failed rows too.", "--cache-failures")
    ] = False,
    cache_max_size: Annotated[str, opt("SIZE", "Prune the cache past this.")] = "256MB",
    junit: Annotated[OptionalPath, opt("FILE", "Sweep: JUnit XML, a case per model.")] = None,
    baseline: Annotated[OptionalPath, opt("FILE", "Sweep: gate on an earlier sweep.")] = None,
) -> None:
    console = console_beside(json_path, html, junit)
    with exit_codes():
        settings = settings_from(
            ctx.params,
            strategy=Strategy(convert.value),
            time=time,
            engine=engine,
            tensor_mode=TensorMode.FAKE if fake else TensorMode.EAGER,
            differential=differential,
            timeline=html is not None,
            gate=Gate.of(fail_share, parse_size(fail_bytes), gate_batch, gate, fail_slowdown),
            compile=compile_,
            force_layout_opt=force_layout_opt,
            table=speed_table,
        )
        patterns = (tuple(p or ()) for p in (models, timm, torchvision, exclude))
        sweep = SweepSettings(
            settings, confirm, max_input_size, timeout, parse_memory(max_memory), jobs
        )
        outcome = commands.audit(
            sweep,
            Selection(*patterns, shard_spec),
            commands.AuditOutputs(json_path, html, junit, checkpoint, ops_index),
            baseline=baseline,
            resume=resume,
            list_only=list_only,
            show_all=show_all,
            verify=verify,
            distributed=commands.Distributed(ddp, fsdp),
            given=frozenset(o for o in ctx.params if given(ctx, o)),
            console=console,
            cache=cache
            and CacheOptions(cache, cache_failures, parse_memory(cache_max_size, CACHE_MAX_FLAG)),
        )
    raise typer.Exit(EXIT[outcome])


app.command("bench")(bench_command)
app.command("merge")(merge_command)
app.command("render")(render_command)
app.command("table")(table_command)
app.add_typer(ops_app, name="ops")


def main() -> None:
    with terminated_as_interrupt():
        code = run_app(app)
    sys.exit(code)
