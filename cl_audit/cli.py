"""The ``cl-audit`` command and ``cl-audit merge``.

Exit codes: 0 no offender, 1 offenders (with ``--baseline``: new offences or failures), 2 usage
error, 3 a model failed to build or run, 130 interrupted.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from cl_audit.audit import Engine, tool_environment
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.render.progress import SweepProgress
from cl_audit.report import Environment, Mode, ModelRow, ReportFormatError, SweepReport
from cl_audit.run import Amp, DType, RunSettings, audit_loaded, parse_input_size
from cl_audit.sources import BuildOptions, load_model
from cl_audit.sweep.plan import ModelRef, parse_shard, select, shard
from cl_audit.sweep.runner import Checkpoint, run_models
from cl_audit.sweep.worker import SweepSettings

__all__ = ["app", "main", "merge_app"]

EXIT_CLEAN, EXIT_OFFENDERS, EXIT_USAGE, EXIT_MODEL_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
LARGE_MODEL_PARAMETERS = 250_000_000  # confirmed in eager mode at CONFIRM_LARGE_SIDE px
CONFIRM_LARGE_SIDE = 160

app = typer.Typer(rich_markup_mode="rich", add_completion=False)
merge_app = typer.Typer(rich_markup_mode="rich", add_completion=False)

Patterns = Optional[list[str]]  # noqa: UP045 (typer needs Optional on Python 3.10)


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def _parse_memory(text: str) -> float:
    """'2GB', '512MB', '1.5G' to megabytes."""
    units = {"": 1.0, "M": 1.0, "MB": 1.0, "MIB": 1.0, "G": 1024.0, "GB": 1024.0, "GIB": 1024.0}
    cleaned = text.strip().upper()
    digits = cleaned.rstrip("BGIM ")
    unit = cleaned[len(digits) :].strip()
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    if value <= 0 or unit not in units:
        raise UsageError(f"--max-memory {text!r}: expected a size such as 2GB or 512MB")
    return value * units[unit]


@app.command()
def audit_command(
    models: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Argument(
            help="torchvision names or globs (resnet50, 'resnet*', all), or "
            "module:factory / path/file.py:factory.",
            show_default=False,
        ),
    ] = None,
    timm_models: Annotated[
        Patterns,
        typer.Option("--timm", help="timm names, globs or 'all'; comma lists.", show_default=False),
    ] = None,
    torchvision_models: Annotated[
        Patterns,
        typer.Option(
            "--torchvision", help="torchvision names, globs or 'all'.", show_default=False
        ),
    ] = None,
    exclude: Annotated[
        Patterns, typer.Option(help="Drop models matching these globs.", show_default=False)
    ] = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="Print the selection (after --shard) and exit.")
    ] = False,
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
    fake: Annotated[
        bool,
        typer.Option(
            "--fake",
            help="Fake tensors: build on meta, no data computed; fast and small, a prediction.",
        ),
    ] = False,
    confirm: Annotated[
        bool,
        typer.Option(help="With --fake: re-run in eager mode the models fake mode flagged."),
    ] = False,
    json_path: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--json", help="Write the JSON report here ('-': stdout).", show_default=False
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Sweep: models audited at once.")] = 2,
    timeout: Annotated[
        float, typer.Option(min=1, help="Sweep: seconds per model before it is killed.")
    ] = 300.0,
    max_memory: Annotated[
        str, typer.Option(help="Sweep: memory a model's worker may allocate, e.g. 2GB.")
    ] = "4GB",
    max_input_size: Annotated[
        int,
        typer.Option(
            min=1, help="Sweep: cap on the default input's height and width (not --input-size)."
        ),
    ] = 256,
    shard_spec: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--shard", help="Sweep: run shard K of N (K/N), split by estimated cost."),
    ] = None,
    checkpoint: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            help="Sweep: JSON Lines file of finished rows. Default: --json's path + .jsonl, "
            "else .cl-audit/sweep-<settings hash>.jsonl",
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Sweep: skip the models already in the checkpoint.")
    ] = False,
    junit: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Sweep: write JUnit XML, one test case per model.", show_default=False),
    ] = None,
    baseline: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            help="Sweep: exit 1 only for offences or failures not in this earlier sweep JSON.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Find the operations where a model's forward pass loses the channels_last format.

    Each model gets random weights and a random input; model and input are converted to
    channels_last (channels_last_3d for 5D), in eval mode under no_grad. One model prints its
    offenders; several (or --junit, --baseline, --shard, --resume) make a sweep, each model in
    a worker of its own.

    [bold]Exit codes[/bold]: 0 no offender, 1 offenders found (with --baseline: new offences
    or failures), 2 usage error (unknown model, bad option), 3 the model failed to build or
    run (a sweep: some model failed and none offended), 130 interrupted.
    """
    json_to_stdout = json_path is not None and str(json_path) == "-"
    console = Console(stderr=json_to_stdout)
    err_console = Console(stderr=True)
    try:
        if confirm and not fake:
            raise UsageError("--confirm re-runs what --fake flagged: use it with --fake")
        run = RunSettings(
            batch_size=batch_size,
            input_size=parse_input_size(input_size) if input_size else None,
            device=device,
            dtype=dtype,
            amp=amp,
            engine=engine,
        )
        refs = select(models or [], timm_models or [], torchvision_models or [], exclude or [])
        if shard_spec is not None:
            refs = shard(refs, *parse_shard(shard_spec))
        if list_only:
            for ref in refs:
                console.print(ref.key, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_CLEAN)
        if not refs:
            raise UsageError("no model selected: give a model name, --timm or --torchvision")
        sweep_outputs = junit or baseline or resume or shard_spec
        if len(refs) == 1 and not sweep_outputs:
            code = _single(refs[0], run, fake, json_path, console)
        else:
            settings = SweepSettings(
                run=run,
                fake=fake,
                confirm=confirm,
                max_input_size=max_input_size,
                timeout=timeout,
                max_memory_mb=_parse_memory(max_memory),
                jobs=jobs,
            )
            selection = {
                "models": models or [],
                "timm": timm_models or [],
                "torchvision": torchvision_models or [],
                "exclude": exclude or [],
                "shard": shard_spec,
            }
            outputs = SweepOutputs(json_path, junit, baseline, checkpoint, resume)
            code = _sweep(refs, settings, selection, outputs, console, err_console)
    except UsageError as e:
        raise _fail(str(e), EXIT_USAGE) from None
    except ModelFailedError as e:
        raise _fail(str(e), EXIT_MODEL_FAILED) from None
    except KeyboardInterrupt:
        raise _fail("interrupted", EXIT_INTERRUPTED) from None
    raise typer.Exit(code)


def _write(path: Path, text: str, option: str) -> None:
    """To a file (gzip-compressed when the name ends in .gz), or stdout for '-'."""
    if str(path) == "-":
        sys.stdout.write(text)
        return
    try:
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(text.encode(), mtime=0))
        else:
            path.write_text(text)
    except OSError as e:
        raise UsageError(f"{option} {path}: {e.strerror}") from None


def _single(
    ref: ModelRef, run: RunSettings, fake: bool, json_path: Path | None, console: Console
) -> int:
    from cl_audit.render.terminal import render_report

    loaded = load_model(ref.name, timm=ref.source == "timm", options=BuildOptions(meta=fake))
    if fake:
        from cl_audit.fake import audit_fake

        report = audit_fake(loaded, run)
    else:
        report = audit_loaded(loaded, run)
    render_report(report, console)
    if json_path is not None:
        _write(json_path, report.to_json() + "\n", "--json")
    return EXIT_OFFENDERS if report.offenders else EXIT_CLEAN


def _default_checkpoint(json_path: Path | None, selection: dict, settings: SweepSettings) -> Path:
    if json_path is not None and str(json_path) != "-":
        return json_path.with_name(json_path.name + ".jsonl")
    config = json.dumps([selection, settings.to_dict()], sort_keys=True, default=str)
    return Path(".cl-audit") / f"sweep-{hashlib.sha1(config.encode()).hexdigest()[:12]}.jsonl"


def _environment(settings: SweepSettings) -> Environment:
    run = settings.run
    return tool_environment(
        device=run.device,
        dtype=run.dtype.value,
        autocast=run.autocast_description,
        engine=run.engine.value,
        mode=Mode.FAKE.value if settings.fake else Mode.EAGER.value,
    )


@dataclass(frozen=True)
class SweepOutputs:
    json_path: Path | None
    junit: Path | None
    baseline: Path | None
    checkpoint: Path | None
    resume: bool


def _sweep(
    refs: list[ModelRef],
    settings: SweepSettings,
    selection: dict,
    outputs: SweepOutputs,
    console: Console,
    err_console: Console,
) -> int:
    from cl_audit.render.junit import junit_xml
    from cl_audit.render.terminal import render_comparison, render_sweep
    from cl_audit.sweep.compare import compare

    baseline = _load_sweep(outputs.baseline) if outputs.baseline is not None else None
    _warm_imports(refs)
    checkpoint = Checkpoint(
        outputs.checkpoint or _default_checkpoint(outputs.json_path, selection, settings)
    )
    wanted = {ref.key for ref in refs}
    done = {k: r for k, r in checkpoint.read().items() if k in wanted} if outputs.resume else {}
    checkpoint.start(keep=outputs.resume)
    todo = [ref for ref in refs if ref.key not in done]
    first_mode = Mode.FAKE if settings.fake else Mode.EAGER
    rows: dict[str, ModelRow] = dict(done)
    interrupted = False
    try:
        _run_pass(todo, settings, first_mode, checkpoint, err_console, rows, len(done))
        if settings.confirm:
            _confirm(rows, settings, checkpoint, err_console)
    except KeyboardInterrupt:
        interrupted = True  # every finished row is already in ``rows`` and the checkpoint
    report = SweepReport.build(
        _environment(settings), {**selection, **settings.to_dict()}, list(rows.values())
    )
    render_sweep(report, console)
    if outputs.json_path is not None:
        _write(outputs.json_path, report.to_json() + "\n", "--json")
    if outputs.junit is not None:
        _write(outputs.junit, junit_xml(report), "--junit")
    if interrupted:
        err_console.print(
            f"interrupted: {len(rows)} of {len(refs)} models done; checkpoint {checkpoint.path} "
            "(--resume continues it)"
        )
        return EXIT_INTERRUPTED
    if baseline is not None:
        comparison = compare(baseline, report)
        render_comparison(comparison, console)
        return EXIT_OFFENDERS if comparison.regressed else EXIT_CLEAN
    if report.summary.offending:
        return EXIT_OFFENDERS
    return EXIT_MODEL_FAILED if report.summary.failed else EXIT_CLEAN


def _confirm(
    rows: dict[str, ModelRow], settings: SweepSettings, checkpoint: Checkpoint, console: Console
) -> None:
    """Re-run in eager mode every model that fake mode flagged or failed, models over
    LARGE_MODEL_PARAMETERS at CONFIRM_LARGE_SIDE px; the eager row replaces the fake one (when
    the eager run fails, its message says what fake mode had found)."""
    flagged = [r for r in rows.values() if r.mode is Mode.FAKE and (r.offending or r.status.failed)]
    if not flagged:
        return
    eager = replace(settings, fake=False)
    smaller = replace(eager, max_input_size=min(settings.max_input_size, CONFIRM_LARGE_SIDE))
    large = [r for r in flagged if (r.parameters or 0) > LARGE_MODEL_PARAMETERS]
    groups = (([r for r in flagged if r not in large], eager), (large, smaller))
    console.print(f"confirming {len(flagged)} models flagged in fake mode, in eager mode")
    for group, group_settings in groups:
        if not group:
            continue
        refs = [ModelRef(r.source, r.name) for r in group]
        _run_pass(refs, group_settings, Mode.CONFIRMED, checkpoint, console, rows)


def _run_pass(
    refs: list[ModelRef],
    settings: SweepSettings,
    mode: Mode,
    checkpoint: Checkpoint,
    console: Console,
    rows: dict[str, ModelRow],
    already_done: int = 0,
) -> None:
    """One pass over ``refs`` with its own progress display; each row lands in ``rows`` as it
    finishes, so an interrupt loses nothing. A failed eager confirmation keeps, in its
    message, what fake mode had found."""

    def finished(row: ModelRow) -> None:
        earlier = rows.get(row.key)
        if mode is Mode.CONFIRMED and row.status.failed and earlier and earlier.offending:
            ops = ", ".join(sorted({f.op for f in earlier.offenders}))
            row = replace(row, message=f"{row.message}; fake mode had flagged: {ops}")
        rows[row.key] = row
        progress.finish(row)

    total = len(refs) + already_done
    with SweepProgress(console, total=total, already_done=already_done) as progress:
        run_models(refs, settings, mode, checkpoint, progress.start, finished)


def _warm_imports(refs: list[ModelRef]) -> None:
    """Import once in the parent, so every forked worker starts warm."""
    import torchvision  # noqa: F401

    import cl_audit.fake  # noqa: F401

    if any(ref.source == "timm" for ref in refs):
        import timm  # noqa: F401


def _load_sweep(path: Path) -> SweepReport:
    try:
        return SweepReport.from_bytes(path.read_bytes())
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except ReportFormatError as e:
        raise UsageError(f"{path}: {e}") from None


@merge_app.command()
def merge_command(
    reports: Annotated[list[Path], typer.Argument(help="Sweep JSON reports (shards).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Merged report ('-': stdout).")],
    force: Annotated[
        bool, typer.Option(help="Merge reports of different versions; later duplicates win.")
    ] = False,
) -> None:
    """Combine sweep reports, e.g. the shards of a CI matrix, into one.

    Exit codes: 0 merged, 2 unreadable input, mixed versions or duplicate models.
    """
    from cl_audit.sweep.compare import merge

    try:
        merged = merge([_load_sweep(path) for path in reports], force=force)
        _write(output, merged.to_json() + "\n", "--output")
    except UsageError as e:
        raise _fail(str(e), EXIT_USAGE) from None
    s = merged.summary
    Console(stderr=True).print(
        f"merged {len(reports)} reports: {s.models} models, {s.offending} offending, "
        f"{s.failed} failed"
    )


def main() -> None:
    if sys.argv[1:2] == ["merge"]:
        merge_app(args=sys.argv[2:], prog_name="cl-audit merge")
    else:
        app(prog_name="cl-audit")
