"""The ``cl-audit`` command: options parsed into settings at the boundary, one call into the
package, and the one place where domain errors become exit codes (``_EXIT_CODES``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from cl_audit import commands
from cl_audit.enums import Amp, DType, Engine, Optimizer, Outcome, Strategy, TensorMode
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.report.verdict import GATE_BATCH, Gate
from cl_audit.settings import AuditSettings, parse_input_size, parse_size
from cl_audit.sweep.api import CacheOptions
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.worker import SweepSettings, parse_memory

__all__ = ["app", "main"]

EXIT_USAGE = 2
_EXIT = {Outcome.CLEAN: 0, Outcome.OFFENDING: 1, Outcome.FAILED: 3, Outcome.INTERRUPTED: 130}


class _AuditByDefault(TyperGroup):
    """``cl-audit MODEL ...`` runs the ``audit`` command; ``merge`` is a command of its own."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] != "--help"):
            args = ["audit", *args]
        return super().parse_args(ctx, args)


# Plain click help: it reads at 80 columns (short help strings; the details are in docs/).
app = typer.Typer(cls=_AuditByDefault, rich_markup_mode=None, add_completion=False)

_EXIT_CODES = (
    "Exit codes: 0 clean or minor, 1 offending: channels_last-only copies reach the"
    " gate (--fail-share and --fail-bytes; with --baseline: new offences, grown costs or"
    " failures), 2 usage error (unknown model, bad option, every model of a sweep skipped; an"
    " installed torch that cannot do what was asked), 3 the model failed to build or run (a"
    " sweep: some model failed and none offended), 130 interrupted."
)


@app.callback(
    help="Find where PyTorch models lose the channels_last memory format.\n\ncl-audit MODEL... "
    "[OPTIONS] audits (see cl-audit audit --help); cl-audit bench MODEL times it in nchw, "
    "channels-last and conv-weights; cl-audit merge combines sweep reports; cl-audit render "
    "turns a saved report into HTML; cl-audit ops indexes every operator's channels_last "
    f"behaviour.\n\n{_EXIT_CODES}"
)
def _help() -> None:
    pass


class _Convert(str, Enum):
    """The strategies an audit can describe (``Strategy`` names them all)."""

    CHANNELS_LAST = Strategy.CHANNELS_LAST.value
    CONV_WEIGHTS = Strategy.CONV_WEIGHTS.value


def _o(metavar: str | None, help: str, *names: str, **more: Any) -> Any:
    """An option shown as ``--name METAVAR`` (None: its choices) with a one-line help; a bool
    given one name is a switch, off unless given."""
    return typer.Option(*names, help=help, metavar=metavar, **more)


_MODELS = "torchvision names or globs, or module:factory / path/file.py:factory."
_NAMES = "%s names, globs or 'all' (several times, or a comma list)."
_CACHE_MAX = "--cache-max-size"
# Option types: typer needs Optional on Python 3.10.
Patterns = Optional[list[str]]  # noqa: UP045
OptionalPath = Optional[Path]  # noqa: UP045
OptionalPaths = Optional[list[Path]]  # noqa: UP045
OptionalText = Optional[str]  # noqa: UP045
OptionalAmp = Optional[Amp]  # noqa: UP045
# The options that audit and bench share, declared once.
InputSize = Annotated[OptionalText, _o("SIZE", "Per-sample CxHxW or CxTxHxW.")]
OptionalInt = Optional[int]  # noqa: UP045
OptionalBool = Optional[bool]  # noqa: UP045
BatchSize = Annotated[OptionalInt, _o("N", "Batch size (default 2).", min=1)]
Device = Annotated[str, _o("DEVICE", "torch device.", "--device")]
DTypeOption = Annotated[DType, typer.Option(help="Model and input dtype.")]
OptimizerOption = Annotated[Optimizer, typer.Option(help="With --train.")]


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option was on the command line (not a default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


@contextlib.contextmanager
def _exit_codes() -> Iterator[None]:
    """Domain errors to their one-line messages and exit codes."""
    try:
        yield
    except UsageError as e:
        raise _fail(str(e), EXIT_USAGE) from None
    except ModelFailedError as e:
        raise _fail(str(e), _EXIT[Outcome.FAILED]) from None
    except KeyboardInterrupt:
        raise _fail("interrupted", _EXIT[Outcome.INTERRUPTED]) from None


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


_SHARED = ("batch_size", "device", "dtype", "amp", "train", "optimizer")  # and input_size


def _settings(params: dict[str, Any], **more: Any) -> AuditSettings:
    """The options that audits and benches share (read from the command's parameters), with
    ``more``, as settings; the package plans them, the device resolved once, before any model
    is built."""
    size = params["input_size"]
    shared = {name: params[name] for name in _SHARED}
    # typer before 0.29 hands ctx.params enum options as their values
    shared["dtype"], shared["optimizer"] = DType(shared["dtype"]), Optimizer(shared["optimizer"])
    shared["amp"] = shared["amp"] and Amp(shared["amp"])
    return AuditSettings(input_size=parse_input_size(size) if size else None, **shared, **more)


@app.command(
    "audit",
    help="Find the operations where a model's forward pass loses the channels_last format.\n\n"
    "Each model gets random weights and a random input; model and input are converted to "
    "channels_last (channels_last_3d for 5D), in eval mode under no_grad. One model prints its "
    "offenders; several (or --junit, --baseline, --shard, --resume, --cache) make a sweep, each "
    f"model in a worker of its own.\n\n{_EXIT_CODES}",
)
def audit_command(
    ctx: typer.Context,
    models: Annotated[Patterns, typer.Argument(help=_MODELS, metavar="MODEL...")] = None,
    timm: Annotated[Patterns, _o("NAMES", _NAMES % "timm", "--timm")] = None,
    torchvision: Annotated[Patterns, _o("NAMES", _NAMES % "torchvision")] = None,
    exclude: Annotated[Patterns, _o("GLOBS", "Drop models matching these globs.")] = None,
    list_only: Annotated[bool, _o(None, "Print the selection and exit.", "--list")] = False,
    input_size: InputSize = None,
    batch_size: BatchSize = None,
    device: Device = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    amp: Annotated[OptionalAmp, _o(None, "Run under autocast with this dtype.")] = None,
    engine: Annotated[Engine, _o(None, "dispatch (aten level) or patch.")] = Engine.DISPATCH,
    fake: Annotated[bool, _o(None, "Fake tensors: a prediction, fast.", "--fake")] = False,
    differential: Annotated[bool, typer.Option(help="Weigh the cost against NCHW.")] = True,
    fail_share: Annotated[float, _o("PCT", "Offend at this % of bytes written...", min=0)] = 1.0,
    fail_bytes: Annotated[str, _o("SIZE", "...and this many extra bytes.")] = "1MiB",
    gate_batch: Annotated[int, _o("N", "...projected to this batch.", min=1)] = GATE_BATCH,
    train: Annotated[bool, _o(None, "Audit a training step, not inference.", "--train")] = False,
    ddp: Annotated[bool, _o(None, "With --train: also the step under DDP.", "--ddp")] = False,
    fsdp: Annotated[bool, _o(None, "With --train: also the FSDP pre-flight.", "--fsdp")] = False,
    optimizer: OptimizerOption = Optimizer.SGD,
    convert: Annotated[_Convert, _o(None, "What is converted.")] = _Convert.CHANNELS_LAST,
    time: Annotated[bool, _o(None, "Time the step and the flagged ops.", "--time")] = False,
    compile_: Annotated[bool, _o(None, "Also Inductor's layout decisions.", "--compile")] = False,
    force_layout_opt: Annotated[bool, _o(None, "Also forced.", "--force-layout-opt")] = False,
    show_all: Annotated[bool, _o(None, "Parameter and neutral losses too.", "--show-all")] = False,
    verify: Annotated[
        OptionalBool,
        _o(None, "Try remedies in what-if runs (one model: on).", "--verify/--no-verify"),
    ] = None,
    confirm: Annotated[bool, _o(None, "With --fake: eager re-run.", "--confirm")] = False,
    json_path: Annotated[OptionalPath, _o("FILE", "JSON report ('-': stdout).", "--json")] = None,
    html: Annotated[OptionalPath, _o("FILE", "Self-contained HTML report.")] = None,
    ops_index: Annotated[
        OptionalPath, _o("FILE", "Link the losses to a saved cl-audit ops index.")
    ] = None,
    jobs: Annotated[int, _o("N", "Sweep: models at once.", min=1)] = 2,
    timeout: Annotated[float, _o("S", "Sweep: seconds per model.", min=1)] = 300.0,
    max_memory: Annotated[str, _o("SIZE", "Sweep: memory cap per model.")] = "4GB",
    max_input_size: Annotated[int, _o("PX", "Sweep: cap on input sides.", min=1)] = 256,
    shard_spec: Annotated[OptionalText, _o("K/N", "Sweep: this shard.", "--shard")] = None,
    checkpoint: Annotated[OptionalPath, _o("FILE", "Sweep: rows so far (JSON Lines).")] = None,
    resume: Annotated[bool, _o(None, "Sweep: skip checkpointed models.", "--resume")] = False,
    cache: Annotated[OptionalPath, _o("DIR", "Sweep: reuse unchanged rows kept here.")] = None,
    cache_failures: Annotated[bool, _o(None, "Reuse failed rows too.", "--cache-failures")] = False,
    cache_max_size: Annotated[str, _o("SIZE", "Prune the cache past this.")] = "256MB",
    junit: Annotated[OptionalPath, _o("FILE", "Sweep: JUnit XML, a case per model.")] = None,
    baseline: Annotated[OptionalPath, _o("FILE", "Sweep: gate on an earlier sweep.")] = None,
) -> None:
    console = Console(stderr=json_path is not None and str(json_path) == "-")
    with _exit_codes():
        settings = _settings(
            ctx.params,
            strategy=Strategy(convert.value),
            time=time,
            engine=engine,
            tensor_mode=TensorMode.FAKE if fake else TensorMode.EAGER,
            differential=differential,
            timeline=html is not None,
            gate=Gate(share=fail_share / 100, bytes=parse_size(fail_bytes), batch=gate_batch),
            compile=compile_,
            force_layout_opt=force_layout_opt,
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
            given=frozenset(o for o in ctx.params if _given(ctx, o)),
            console=console,
            cache=cache
            and CacheOptions(cache, cache_failures, parse_memory(cache_max_size, _CACHE_MAX)),
        )
    raise typer.Exit(_EXIT[outcome])


@app.command("bench")
def bench_command(
    ctx: typer.Context,
    model: Annotated[OptionalText, typer.Argument(help=_MODELS, metavar="MODEL")] = None,
    timm_model: Annotated[OptionalText, _o("NAME", "A timm model.", "--timm")] = None,
    input_size: InputSize = None,
    batch_size: BatchSize = None,
    device: Device = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    amp: Annotated[OptionalAmp, _o(None, "Also time every strategy under autocast.")] = None,
    train: Annotated[bool, _o(None, "Time training steps, not inference.", "--train")] = False,
    optimizer: OptimizerOption = Optimizer.SGD,
    rounds: Annotated[int, _o("N", "Alternating rounds.", min=1)] = 7,
    warmup: Annotated[int, _o("N", "Least warm-up steps.", min=0)] = 3,
    steps: Annotated[int, _o("N", "Steps timed per round.", min=1)] = 3,
    threads: Annotated[OptionalInt, _o("N", "torch intra-op threads.", min=1)] = None,
    attribute: Annotated[bool, typer.Option(help="Time the channels-last findings.")] = True,
    json_path: Annotated[OptionalPath, _o("FILE", "Bench JSON ('-': stdout).", "--json")] = None,
    dashboard_json: Annotated[OptionalPath, _o("FILE", "PyTorch OSS benchmark records.")] = None,
) -> None:
    """Time a model in nchw, channels-last and conv-weights, then its channels-last findings.

    Exit codes: 0 benched, 2 usage error, 3 the model failed to build or run, 130 interrupted."""
    from cl_audit.features.bench import BenchSettings

    console = Console(stderr=json_path is not None and str(json_path) == "-")
    with _exit_codes():
        settings = BenchSettings(
            _settings(ctx.params),
            rounds=rounds,
            warmup=warmup,
            steps_per_round=steps,
            threads=threads,
            attribute=attribute,
        )
        commands.bench(model, timm_model, settings, json_path, dashboard_json, console)


ops_app = typer.Typer(rich_markup_mode=None, add_completion=False)
app.add_typer(ops_app, name="ops")


@ops_app.callback(invoke_without_command=True)
def ops_command(
    ctx: typer.Context,
    op: Annotated[Patterns, _o("GLOB", "Only operators matching (repeatable).")] = None,
    loses: Annotated[bool, _o(None, "Only operators that lose or refuse.", "--loses")] = False,
    device: Annotated[
        str, _o("DEVICE", "cpu, or cuda (fake: predicted without a GPU).", "--device")
    ] = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    json_path: Annotated[
        OptionalPath, _o("FILE", "The index as JSON ('-': stdout).", "--json")
    ] = None,
    html_path: Annotated[OptionalPath, _o("FILE", "The index as HTML.", "--html")] = None,
    index_path: Annotated[
        OptionalPath, _o("FILE", "Read a saved index instead.", "--index")
    ] = None,
    from_sweep: Annotated[
        OptionalPaths, _o("FILE", "Rank what a sweep's losses cost (repeatable).", "--from-sweep")
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
    with _exit_codes():
        console = Console(stderr=json_path is not None and str(json_path) == "-")
        sources = commands.OpsSources(index_path, tuple(from_sweep or ()))
        outputs = commands.OpsOutputs(json_path, html_path)
        commands.ops(tuple(op or ()), loses, device, dtype, outputs, sources, console)


@ops_app.command("diff")
def ops_diff_command(
    old: Annotated[Path, typer.Argument(help="An index saved with --json.", metavar="OLD")],
    new: Annotated[Path, typer.Argument(help="Another, to compare.", metavar="NEW")],
) -> None:
    """What changed between two saved indexes (a torch release against another): each operator
    whose behaviour differs, worse first.

    Exit codes: 0 compared, 2 unreadable index."""
    with _exit_codes():
        commands.ops_diff(old, new, Console())


@app.command("merge")
def merge_command(
    reports: Annotated[list[Path], typer.Argument(help="Sweep reports.", metavar="REPORT...")],
    output: Annotated[Path, _o("FILE", "Merged report ('-': stdout).", "-o", "--output")],
    force: Annotated[bool, _o(None, "Mix versions; later duplicates win.", "--force")] = False,
    baseline: Annotated[OptionalPath, _o("FILE", "Gate on an earlier sweep JSON.")] = None,
) -> None:
    """Combine sweep reports (the shards of a CI matrix) into one.

    Exit codes: 0 merged (with --baseline: nothing new), 1 with --baseline: new offences or
    failures, 2 unreadable input, mixed versions or duplicate models."""
    with _exit_codes():
        outcome = commands.merge_reports(
            reports, output, force=force, baseline=baseline, console=Console(stderr=True)
        )
    raise typer.Exit(_EXIT[outcome])


@app.command("render")
def render_command(
    report_path: Annotated[Path, typer.Argument(help="A JSON report (.gz too).", metavar="REPORT")],
    html: Annotated[Path, _o("FILE", "Write the HTML report here.", "--html")],
    ops_index: Annotated[
        OptionalPath, _o("FILE", "Link a model's losses to a saved cl-audit ops index.")
    ] = None,
) -> None:
    """Render a saved model or sweep report (any version) as one self-contained HTML file.

    Exit codes: 0 written, 2 unreadable report or index, or unwritable path."""
    with _exit_codes():
        commands.render(report_path, html, ops_index)


def main() -> None:
    app(prog_name="cl-audit")
