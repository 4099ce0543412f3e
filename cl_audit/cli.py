"""The ``cl-audit`` command: options parsed into settings at the boundary, one call into the
package, and the one place where domain errors become exit codes.

Exit codes: 0 clean or minor, 1 offending (the cost reaches the gate; with ``--baseline``: new
offences, grown costs or failures), 2 usage error, 3 a model failed to build or run, 130
interrupted.
"""

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
from cl_audit.enums import Outcome
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.report.cost import Gate
from cl_audit.settings import (
    Amp,
    AuditSettings,
    DType,
    Engine,
    Optimizer,
    Strategy,
    TensorMode,
    parse_input_size,
    parse_size,
    resolve_device,
)
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
Patterns = Optional[list[str]]  # noqa: UP045 (typer needs Optional on Python 3.10)
OptionalPath = Optional[Path]  # noqa: UP045


@app.callback()
def _help() -> None:
    """Find where PyTorch models lose the channels_last memory format.

    [bold]cl-audit MODEL... [OPTIONS][/bold] audits (see [bold]cl-audit audit --help[/bold]);
    [bold]cl-audit bench MODEL[/bold] times it in nchw, channels-last and conv-weights;
    [bold]cl-audit merge[/bold] combines sweep reports; [bold]cl-audit render[/bold] turns a
    saved report into HTML.

    [bold]Exit codes[/bold]: 0 clean or minor, 1 offending: channels_last-only copies reach
    the gate (--fail-share and --fail-bytes; with --baseline: new offences, grown costs or
    failures), 2 usage error (unknown model, bad option, every model of a sweep
    skipped; an installed torch that cannot do what was asked), 3 the model failed to build or
    run (a sweep: some model failed and none offended), 130 interrupted.
    """


_MODELS_HELP = "torchvision names or globs, or module:factory / path/file.py:factory."
_DIFFERENTIAL_HELP = (
    "Re-run in NCHW and weigh what channels_last costs against it (without it, no cost: "
    "any offender offends)."
)
_CHECKPOINT_HELP = "Sweep: JSON Lines of finished rows (default: --json's path + .jsonl)."
_CACHE_HELP = (
    "Sweep: reuse rows of earlier sweeps kept in DIR while each model's source files, the "
    "settings and the versions are unchanged."
)
_CONVERT_HELP = "channels-last: model and input; conv-weights: convolution weights only."


class _Convert(str, Enum):
    """The strategies an audit can describe (``Strategy`` names them all)."""

    CHANNELS_LAST = Strategy.CHANNELS_LAST.value
    CONV_WEIGHTS = Strategy.CONV_WEIGHTS.value


_TIME_HELP = "Time the step and profile the flagged operations (eager, one model)."
_COMPILE_HELP = "Also what torch.compile's Inductor decides about layouts per graph, and why."


def _opt(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, show_default=False)


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


@app.command("audit")
def audit_command(
    ctx: typer.Context,
    models: Annotated[Patterns, typer.Argument(help=_MODELS_HELP, show_default=False)] = None,
    timm_models: Annotated[Patterns, _opt("--timm", help="timm names, globs, 'all'.")] = None,
    torchvision_models: Annotated[
        Patterns, _opt("--torchvision", help="torchvision names, globs or 'all'.")
    ] = None,
    exclude: Annotated[Patterns, _opt(help="Drop models matching these globs.")] = None,
    list_only: Annotated[bool, _opt("--list", help="Print the selection and exit.")] = False,
    input_size: Annotated[Optional[str], _opt(help="Per-sample CxHxW or CxTxHxW.")] = None,  # noqa: UP045
    batch_size: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1, help="Batch size (default 2; an example input's own).", show_default=False
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="torch device.")] = "cpu",
    dtype: Annotated[DType, typer.Option(help="Model and input dtype.")] = DType.FLOAT32,
    amp: Annotated[Optional[Amp], _opt(help="Run under autocast with this dtype.")] = None,  # noqa: UP045
    engine: Annotated[Engine, typer.Option(help="dispatch: aten level; patch: wrapping.")] = (
        Engine.DISPATCH
    ),
    fake: Annotated[bool, _opt("--fake", help="Fake tensors: a prediction, fast.")] = False,
    differential: Annotated[bool, typer.Option(help=_DIFFERENTIAL_HELP)] = True,
    fail_share: Annotated[
        float, typer.Option(min=0, help="Offend at this % of the bytes written (and --fail-bytes).")
    ] = 1.0,
    fail_bytes: Annotated[
        str, typer.Option(help="Offend at this many channels_last-only bytes (and --fail-share).")
    ] = "1MiB",
    train: Annotated[bool, _opt("--train", help="Audit a training step, not inference.")] = False,
    optimizer: Annotated[Optimizer, typer.Option(help="With --train.")] = Optimizer.SGD,
    convert: Annotated[_Convert, typer.Option(help=_CONVERT_HELP)] = _Convert.CHANNELS_LAST,
    time: Annotated[bool, _opt("--time", help=_TIME_HELP)] = False,
    compile_: Annotated[bool, _opt("--compile", help=_COMPILE_HELP)] = False,
    force_layout_opt: Annotated[
        bool, _opt("--force-layout-opt", help="With --compile: also decide with Inductor forced.")
    ] = False,
    show_all: Annotated[bool, _opt(help="List parameter and format-neutral losses too.")] = False,
    confirm: Annotated[bool, _opt(help="With --fake: eager re-run of what it flagged.")] = False,
    json_path: Annotated[OptionalPath, _opt("--json", help="JSON report ('-': stdout).")] = None,
    html: Annotated[OptionalPath, _opt(help="Self-contained HTML report.")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Sweep: models audited at once.")] = 2,
    timeout: Annotated[float, typer.Option(min=1, help="Sweep: seconds per model.")] = 300.0,
    max_memory: Annotated[str, typer.Option(help="Sweep: memory cap per model.")] = "4GB",
    max_input_size: Annotated[
        int, typer.Option(min=1, help="Sweep: cap on the default input's sides.")
    ] = 256,
    shard_spec: Annotated[Optional[str], _opt("--shard", help="Sweep: shard K/N.")] = None,  # noqa: UP045
    checkpoint: Annotated[OptionalPath, _opt(help=_CHECKPOINT_HELP)] = None,
    resume: Annotated[bool, _opt(help="Sweep: skip models in the checkpoint.")] = False,
    cache: Annotated[OptionalPath, _opt(help=_CACHE_HELP)] = None,
    cache_failures: Annotated[
        bool, _opt(help="With --cache: reuse failed rows too (default: re-run them).")
    ] = False,
    cache_max_size: Annotated[
        str, typer.Option(help="With --cache: prune least recently used entries past this.")
    ] = "256MB",
    junit: Annotated[OptionalPath, _opt(help="Sweep: JUnit XML, a case per model.")] = None,
    baseline: Annotated[OptionalPath, _opt(help="Sweep: gate on an earlier sweep JSON.")] = None,
) -> None:
    """Find the operations where a model's forward pass loses the channels_last format.

    Each model gets random weights and a random input; model and input are converted to
    channels_last (channels_last_3d for 5D), in eval mode under no_grad. One model prints its
    offenders; several (or --junit, --baseline, --shard, --resume, --cache) make a sweep, each
    model in a worker of its own.

    [bold]Exit codes[/bold]: 0 clean or minor, 1 offending: channels_last-only copies reach
    the gate (--fail-share and --fail-bytes; with --baseline: new offences, grown costs or
    failures), 2 usage error (unknown model, bad option, every model of a sweep
    skipped; an installed torch that cannot do what was asked), 3 the model failed to build or
    run (a sweep: some model failed and none offended), 130 interrupted.
    """
    console = Console(stderr=json_path is not None and str(json_path) == "-")
    with _exit_codes():
        if confirm and not fake:
            raise UsageError("--confirm re-runs what --fake flagged: use it with --fake")
        for option in ("cache_failures", "cache_max_size"):
            if cache is None and _given(ctx, option):
                flag = "--" + option.replace("_", "-")
                raise UsageError(f"{flag} sets how --cache works: give --cache DIR too")
        settings = _settings(
            batch_size,
            input_size,
            device,
            dtype,
            amp,
            train,
            optimizer,
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
        selection = Selection(
            tuple(models or ()),
            tuple(timm_models or ()),
            tuple(torchvision_models or ()),
            tuple(exclude or ()),
            shard_spec,
        )
        sweep = SweepSettings(
            audit=settings,
            confirm=confirm,
            max_input_size=max_input_size,
            timeout=timeout,
            max_memory_mb=parse_memory(max_memory),
            jobs=jobs,
        )
        outcome = commands.audit(
            sweep,
            selection,
            commands.AuditOutputs(json_path, html, junit, checkpoint),
            baseline=baseline,
            resume=resume,
            list_only=list_only,
            show_all=show_all,
            unapplied=tuple(o for o in commands.SWEEP_ONLY if _given(ctx, o)),
            console=console,
            cache=None
            if cache is None
            else commands.CacheOptions(
                cache, cache_failures, parse_memory(cache_max_size, "--cache-max-size")
            ),
        )
    raise typer.Exit(_EXIT[outcome])


def _settings(
    batch_size: int | None,
    input_size: str | None,
    device: str,
    dtype: DType,
    amp: Amp | None,
    train: bool,
    optimizer: Optimizer,
    **more: Any,
) -> AuditSettings:
    """The options that audits and benches share, parsed into settings (the device checked
    once here, before any model is built)."""
    settings = AuditSettings(
        batch_size=batch_size,
        input_size=parse_input_size(input_size) if input_size else None,
        device=device,
        dtype=dtype,
        amp=amp,
        train=train,
        optimizer=optimizer,
        **more,
    )
    resolve_device(settings.device, settings.tensor_mode, settings.bfloat16)
    return settings


@app.command("bench")
def bench_command(
    model: Annotated[Optional[str], typer.Argument(help=_MODELS_HELP, show_default=False)] = None,  # noqa: UP045
    timm_model: Annotated[Optional[str], _opt("--timm", help="A timm model name.")] = None,  # noqa: UP045
    input_size: Annotated[Optional[str], _opt(help="Per-sample CxHxW or CxTxHxW.")] = None,  # noqa: UP045
    batch_size: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1, help="Batch size (default 2; an example input's own).", show_default=False
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="torch device.")] = "cpu",
    dtype: Annotated[DType, typer.Option(help="Model and input dtype.")] = DType.FLOAT32,
    amp: Annotated[
        Optional[Amp],  # noqa: UP045
        _opt(help="Also time every strategy under autocast with this dtype."),
    ] = None,
    train: Annotated[bool, _opt("--train", help="Time training steps, not inference.")] = False,
    optimizer: Annotated[Optimizer, typer.Option(help="With --train.")] = Optimizer.SGD,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds (median).")] = 7,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed steps per configuration.")] = 3,
    steps: Annotated[int, typer.Option(min=1, help="Steps timed per round.")] = 3,
    threads: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1, help="torch intra-op threads (default: torch's own).", show_default=False
        ),
    ] = None,
    attribute: Annotated[
        bool, typer.Option(help="Profile the channels-last step and time its findings.")
    ] = True,
    json_path: Annotated[
        OptionalPath, _opt("--json", help="cl-audit.bench JSON ('-': stdout).")
    ] = None,
    dashboard_json: Annotated[
        OptionalPath, _opt(help="Records for PyTorch's OSS benchmark database.")
    ] = None,
) -> None:
    """Time a model in NCHW, channels-last and conv-weights, side by side.

    Each configuration runs on its own copy of the model; rounds alternate between them and
    the median is reported with its spread. The channels-last step is then audited under
    torch.profiler, so each operation that loses the format gets its time.

    Exit codes: 0 benched, 2 usage error, 3 the model failed to build or run, 130 interrupted.
    """
    from cl_audit.bench import BenchSettings

    console = Console(stderr=json_path is not None and str(json_path) == "-")
    with _exit_codes():
        settings = BenchSettings(
            audit=_settings(batch_size, input_size, device, dtype, amp, train, optimizer),
            rounds=rounds,
            warmup=warmup,
            steps_per_round=steps,
            threads=threads,
            attribute=attribute,
        )
        commands.bench(
            model,
            timm_model,
            settings,
            json_path=json_path,
            dashboard_json=dashboard_json,
            console=console,
        )


@app.command("merge")
def merge_command(
    reports: Annotated[list[Path], typer.Argument(help="Sweep JSON reports (shards).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Merged report ('-': stdout).")],
    force: Annotated[
        bool, typer.Option(help="Merge reports of different versions; later duplicates win.")
    ] = False,
    baseline: Annotated[
        OptionalPath, _opt(help="Gate the merged report on an earlier sweep JSON.")
    ] = None,
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
