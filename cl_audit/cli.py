"""The ``cl-audit`` command. Exit codes: 0 no offender, 1 offenders, 2 usage error,
3 the model failed to build or run, 130 interrupted."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from cl_audit.audit import Engine
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.run import Amp, DType, RunSettings, audit_loaded, parse_input_size
from cl_audit.sources import load_model

__all__ = ["app", "main"]

EXIT_CLEAN, EXIT_OFFENDERS, EXIT_USAGE, EXIT_MODEL_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

app = typer.Typer(rich_markup_mode="rich", add_completion=False)


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


@app.command()
def audit_command(
    model: Annotated[
        Optional[str],  # noqa: UP045 (typer needs Optional on Python 3.10)
        typer.Argument(
            help="torchvision model name (resnet50), or module:factory / path/file.py:factory.",
            show_default=False,
        ),
    ] = None,
    timm_model: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--timm", help="timm model name.", show_default=False),
    ] = None,
    input_size: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Per-sample input, CxHxW or CxTxHxW. Default: the model's own."),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Batch size.")] = 2,
    device: Annotated[str, typer.Option(help="torch device.")] = "cpu",
    dtype: Annotated[DType, typer.Option(help="Model and input dtype.")] = DType.FLOAT32,
    amp: Annotated[
        Optional[Amp],  # noqa: UP045
        typer.Option(help="Run under autocast with this dtype.", show_default=False),
    ] = None,
    engine: Annotated[
        Engine, typer.Option(help="dispatch: aten-level mode. patch: wrap torch callables.")
    ] = Engine.DISPATCH,
    json_path: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--json", help="Write the JSON report here ('-': stdout).", show_default=False
        ),
    ] = None,
) -> None:
    """Find the operations where a model's forward pass loses the channels_last format.

    The model gets random weights and a random input; model and input are converted to
    channels_last (channels_last_3d for 5D), in eval mode under no_grad.

    [bold]Exit codes[/bold]: 0 no offender, 1 offenders found, 2 usage error (unknown model,
    bad option), 3 the model failed to build or run, 130 interrupted.
    """
    if (model is None) == (timm_model is None):
        raise _fail("give exactly one model: a NAME argument or --timm NAME", EXIT_USAGE)
    json_to_stdout = json_path is not None and str(json_path) == "-"
    console = Console(stderr=json_to_stdout)
    try:
        settings = RunSettings(
            batch_size=batch_size,
            input_size=parse_input_size(input_size) if input_size else None,
            device=device,
            dtype=dtype,
            amp=amp,
            engine=engine,
        )
        loaded = load_model(timm_model or model or "", timm=timm_model is not None)
        report = audit_loaded(loaded, settings)
    except UsageError as e:
        raise _fail(str(e), EXIT_USAGE) from None
    except ModelFailedError as e:
        raise _fail(str(e), EXIT_MODEL_FAILED) from None
    except KeyboardInterrupt:
        raise _fail("interrupted", EXIT_INTERRUPTED) from None
    from cl_audit.render.terminal import render_report

    render_report(report, console)
    if json_path is not None:
        if json_to_stdout:
            sys.stdout.write(report.to_json() + "\n")
        else:
            try:
                json_path.write_text(report.to_json() + "\n")
            except OSError as e:
                raise _fail(f"--json {json_path}: {e.strerror}", EXIT_USAGE) from None
    raise typer.Exit(EXIT_OFFENDERS if report.offenders else EXIT_CLEAN)


def main() -> None:
    app(prog_name="cl-audit")
