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
from cl_audit.report.cost import Gate
from cl_audit.settings import AuditSettings, parse_input_size, parse_size
from cl_audit.sweep.api import CacheOptions
from cl_audit.sweep.plan import Selection
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


app = typer.Typer(cls=_AuditByDefault, rich_markup_mode="rich", add_completion=False)

_EXIT_CODES = (
    "[bold]Exit codes[/bold]: 0 clean or minor, 1 offending: channels_last-only copies reach the"
    " gate (--fail-share and --fail-bytes; with --baseline: new offences, grown costs or"
    " failures), 2 usage error (unknown model, bad option, every model of a sweep skipped; an"
    " installed torch that cannot do what was asked), 3 the model failed to build or run (a"
    " sweep: some model failed and none offended), 130 interrupted."
)


@app.callback(
    help="Find where PyTorch models lose the channels_last memory format.\n\n[bold]cl-audit "
    "MODEL... [OPTIONS][/bold] audits (see [bold]cl-audit audit --help[/bold]); [bold]cl-audit "
    "bench MODEL[/bold] times it in nchw, channels-last and conv-weights; [bold]cl-audit merge"
    "[/bold] combines sweep reports; [bold]cl-audit render[/bold] turns a saved report into "
    f"HTML.\n\n{_EXIT_CODES}"
)
def _help() -> None:
    pass


class _Convert(str, Enum):
    """The strategies an audit can describe (``Strategy`` names them all)."""

    CHANNELS_LAST = Strategy.CHANNELS_LAST.value
    CONV_WEIGHTS = Strategy.CONV_WEIGHTS.value


def _opt(*names: str, help: str, **more: Any) -> Any:
    return typer.Option(*names, help=help, show_default=False, **more)


_MODELS = "torchvision names or globs, or module:factory / path/file.py:factory."
_CACHE_MAX = "--cache-max-size"
# Option types: typer needs Optional on Python 3.10.
Patterns = Optional[list[str]]  # noqa: UP045
OptionalPath = Optional[Path]  # noqa: UP045
OptionalText = Optional[str]  # noqa: UP045
OptionalAmp = Optional[Amp]  # noqa: UP045
# The options that audit and bench share, declared once.
InputSize = Annotated[OptionalText, _opt(help="Per-sample CxHxW or CxTxHxW.")]
OptionalInt = Optional[int]  # noqa: UP045
BatchSize = Annotated[OptionalInt, _opt(min=1, help="Batch size (default 2; an example's own).")]
Device = Annotated[str, typer.Option(help="torch device.")]
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
    models: Annotated[Patterns, typer.Argument(help=_MODELS, show_default=False)] = None,
    timm: Annotated[Patterns, _opt("--timm", help="timm names, globs, 'all'.")] = None,
    torchvision: Annotated[Patterns, _opt(help="torchvision names, globs or 'all'.")] = None,
    exclude: Annotated[Patterns, _opt(help="Drop models matching these globs.")] = None,
    list_only: Annotated[bool, _opt("--list", help="Print the selection and exit.")] = False,
    input_size: InputSize = None,
    batch_size: BatchSize = None,
    device: Device = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    amp: Annotated[OptionalAmp, _opt(help="Run under autocast with this dtype.")] = None,
    engine: Annotated[Engine, _opt(help="dispatch (aten level) or patch.")] = Engine.DISPATCH,
    fake: Annotated[bool, _opt("--fake", help="Fake tensors: a prediction, fast.")] = False,
    differential: Annotated[bool, typer.Option(help="Weigh the cost against NCHW.")] = True,
    fail_share: Annotated[float, typer.Option(min=0, help="Offend at this % written...")] = 1.0,
    fail_bytes: Annotated[str, typer.Option(help="...and this many extra bytes.")] = "1MiB",
    train: Annotated[bool, _opt("--train", help="Audit a training step, not inference.")] = False,
    optimizer: OptimizerOption = Optimizer.SGD,
    convert: Annotated[_Convert, typer.Option(help="What is converted.")] = _Convert.CHANNELS_LAST,
    time: Annotated[bool, _opt("--time", help="Time the step and the flagged operations.")] = False,
    compile_: Annotated[bool, _opt("--compile", help="Also Inductor's layout decisions.")] = False,
    force_layout_opt: Annotated[bool, _opt(help="With --compile: Inductor forced too.")] = False,
    show_all: Annotated[bool, _opt(help="List parameter and format-neutral losses too.")] = False,
    confirm: Annotated[bool, _opt(help="With --fake: eager re-run of what it flagged.")] = False,
    json_path: Annotated[OptionalPath, _opt("--json", help="JSON report ('-': stdout).")] = None,
    html: Annotated[OptionalPath, _opt(help="Self-contained HTML report.")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Sweep: models audited at once.")] = 2,
    timeout: Annotated[float, typer.Option(min=1, help="Sweep: seconds per model.")] = 300.0,
    max_memory: Annotated[str, typer.Option(help="Sweep: memory cap per model.")] = "4GB",
    max_input_size: Annotated[int, typer.Option(min=1, help="Sweep: cap on input sides.")] = 256,
    shard_spec: Annotated[OptionalText, _opt("--shard", help="Sweep: shard K/N.")] = None,
    checkpoint: Annotated[OptionalPath, _opt(help="Sweep: JSON Lines of finished rows.")] = None,
    resume: Annotated[bool, _opt(help="Sweep: skip models in the checkpoint.")] = False,
    cache: Annotated[OptionalPath, _opt(help="Sweep: reuse unchanged rows kept in DIR.")] = None,
    cache_failures: Annotated[bool, _opt(help="With --cache: reuse failed rows too.")] = False,
    cache_max_size: Annotated[str, typer.Option(help="With --cache: prune past this.")] = "256MB",
    junit: Annotated[OptionalPath, _opt(help="Sweep: JUnit XML, a case per model.")] = None,
    baseline: Annotated[OptionalPath, _opt(help="Sweep: gate on an earlier sweep JSON.")] = None,
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
            gate=Gate(share=fail_share / 100, bytes=parse_size(fail_bytes)),
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
            commands.AuditOutputs(json_path, html, junit, checkpoint),
            baseline=baseline,
            resume=resume,
            list_only=list_only,
            show_all=show_all,
            given=frozenset(o for o in ctx.params if _given(ctx, o)),
            console=console,
            cache=cache
            and CacheOptions(cache, cache_failures, parse_memory(cache_max_size, _CACHE_MAX)),
        )
    raise typer.Exit(_EXIT[outcome])


@app.command("bench")
def bench_command(
    ctx: typer.Context,
    model: Annotated[OptionalText, typer.Argument(help=_MODELS, show_default=False)] = None,
    timm_model: Annotated[OptionalText, _opt("--timm", help="A timm model name.")] = None,
    input_size: InputSize = None,
    batch_size: BatchSize = None,
    device: Device = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    amp: Annotated[OptionalAmp, _opt(help="Also time every strategy under autocast.")] = None,
    train: Annotated[bool, _opt("--train", help="Time training steps, not inference.")] = False,
    optimizer: OptimizerOption = Optimizer.SGD,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds (median).")] = 7,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed steps per configuration.")] = 3,
    steps: Annotated[int, typer.Option(min=1, help="Steps timed per round.")] = 3,
    threads: Annotated[OptionalInt, _opt(min=1, help="torch intra-op threads.")] = None,
    attribute: Annotated[bool, typer.Option(help="Time the channels-last findings.")] = True,
    json_path: Annotated[OptionalPath, _opt("--json", help="Bench JSON ('-': stdout).")] = None,
    dashboard_json: Annotated[OptionalPath, _opt(help="PyTorch OSS benchmark records.")] = None,
) -> None:
    """Time a model in NCHW, channels-last and conv-weights, side by side (alternating rounds,
    the median and its spread), then each channels-last finding under torch.profiler.

    Exit codes: 0 benched, 2 usage error, 3 the model failed to build or run, 130 interrupted.
    """
    from cl_audit.bench import BenchSettings

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


@app.command("merge")
def merge_command(
    reports: Annotated[list[Path], typer.Argument(help="Sweep JSON reports (shards).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Merged report ('-': stdout).")],
    force: Annotated[bool, typer.Option(help="Mix versions; later duplicates win.")] = False,
    baseline: Annotated[OptionalPath, _opt(help="Gate on an earlier sweep JSON.")] = None,
) -> None:
    """Combine sweep reports, e.g. the shards of a CI matrix, into one.

    Exit codes: 0 merged (with --baseline: nothing new), 1 with --baseline: new offences or
    failures, 2 unreadable input, mixed versions or duplicate models.
    """
    with _exit_codes():
        outcome = commands.merge_reports(
            reports, output, force=force, baseline=baseline, console=Console(stderr=True)
        )
    raise typer.Exit(_EXIT[outcome])


@app.command("render")
def render_command(
    report_path: Annotated[Path, typer.Argument(help="A model or sweep JSON report (.gz too).")],
    html: Annotated[Path, typer.Option("--html", help="Write the HTML report here.")],
) -> None:
    """Render a saved report (any version) as one self-contained HTML file.

    Exit codes: 0 written, 2 unreadable report or unwritable path.
    """
    with _exit_codes():
        commands.render(report_path, html)


def main() -> None:
    app(prog_name="cl-audit")
