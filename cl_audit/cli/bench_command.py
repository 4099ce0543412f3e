"""``cl-audit bench MODEL``: a model timed in nchw, channels-last and conv-weights, then its
channels-last findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from cl_audit.cli.console import console_beside, models_print_to_stderr, wrote
from cl_audit.cli.exits import exit_codes
from cl_audit.cli.options import (
    MODELS_HELP,
    BatchSize,
    CompileBackend,
    CompileDynamic,
    CompileDynamicOption,
    CompileMode,
    Device,
    DTypeOption,
    InputSize,
    OptimizerOption,
    OptionalAmp,
    OptionalInt,
    OptionalPath,
    OptionalText,
    audit_settings,
    compile_options,
    opt,
)
from cl_audit.enums import DType, Optimizer
from cl_audit.errors import UsageError
from cl_audit.execution.plan import plan_run
from cl_audit.execution.rounds import ROUNDS, STEPS, WARMUP
from cl_audit.execution.settings import CompileOptions
from cl_audit.report.files import check_writable, write_json, write_text
from cl_audit.sources import BuildOptions, load_model
from cl_audit.sweep.selection import select

if TYPE_CHECKING:
    from cl_audit.features.bench import BenchSettings

__all__ = ["bench", "bench_command"]


def bench_command(
    model: Annotated[OptionalText, typer.Argument(help=MODELS_HELP, metavar="MODEL")] = None,
    timm_model: Annotated[OptionalText, opt("NAME", "A timm model.", "--timm")] = None,
    input_size: InputSize = None,
    batch_size: BatchSize = None,
    device: Device = "cpu",
    dtype: DTypeOption = DType.FLOAT32,
    amp: Annotated[OptionalAmp, opt(None, "Also time every strategy under autocast.")] = None,
    train: Annotated[bool, opt(None, "Time training steps, not inference.", "--train")] = False,
    optimizer: OptimizerOption = Optimizer.SGD,
    rounds: Annotated[int, opt("N", "Alternating rounds.", min=1)] = ROUNDS,
    warmup: Annotated[int, opt("N", "Least warm-up steps.", min=0)] = WARMUP,
    steps: Annotated[int, opt("N", "Steps timed per round.", min=1)] = STEPS,
    threads: Annotated[OptionalInt, opt("N", "torch intra-op threads.", min=1)] = None,
    attribute: Annotated[bool, typer.Option(help="Time the channels-last findings.")] = True,
    compile_: Annotated[
        bool, opt(None, "Also nchw and channels-last through torch.compile.", "--compile")
    ] = False,
    compile_mode: CompileMode = None,
    compile_backend: CompileBackend = "inductor",
    compile_dynamic: CompileDynamicOption = CompileDynamic.AUTO,
    json_path: Annotated[OptionalPath, opt("FILE", "Bench JSON ('-': stdout).", "--json")] = None,
    dashboard_json: Annotated[OptionalPath, opt("FILE", "PyTorch OSS benchmark records.")] = None,
) -> None:
    """Time a model in nchw, channels-last and conv-weights, then its channels-last findings.

    Exit codes: 0 benched, 2 usage error, 3 the model failed to build or run, 130 interrupted."""
    from cl_audit.features.bench import BenchSettings

    console = console_beside(json_path, dashboard_json)
    with exit_codes():
        settings = BenchSettings(
            audit_settings(input_size, batch_size, device, dtype, amp, train, optimizer),
            rounds=rounds,
            warmup=warmup,
            steps_per_round=steps,
            threads=threads,
            attribute=attribute,
            compile=_compile_options(compile_, compile_mode, compile_backend, compile_dynamic),
        )
        bench(model, timm_model, settings, json_path, dashboard_json, console)


def _compile_options(
    on: bool, mode: str | None, backend: str, dynamic: CompileDynamic
) -> CompileOptions | None:
    options = compile_options(mode, backend, dynamic)
    if not on and options != CompileOptions():
        raise UsageError("--compile-mode, --compile-backend and --compile-dynamic: add --compile")
    return options if on else None


def bench(
    model: str | None,
    timm_model: str | None,
    settings: BenchSettings,
    json_path: Path | None,
    dashboard_json: Path | None,
    console: Console,
) -> None:
    """Bench one model and write its outputs."""
    from cl_audit.features.bench import bench_module
    from cl_audit.render.bench_table import render_bench
    from cl_audit.report.bench_report import dashboard_records
    from cl_audit.sources.source_audit import prepare

    specs = [spec for spec in (model, timm_model) if spec]
    if len(specs) != 1:
        raise UsageError("bench one model: a torchvision name, module:factory, or --timm NAME")
    refs = select([model] if model else [], [timm_model] if timm_model else [], [], [])
    if len(refs) != 1:
        raise UsageError(f"bench one model: {specs[0]!r} selects {len(refs)}")
    for path, option in ((json_path, "--json"), (dashboard_json, "--dashboard-json")):
        check_writable(path, option)
    (ref,) = refs
    plan = plan_run(settings.audit)
    with models_print_to_stderr():
        loaded = load_model(ref, BuildOptions(input_size=plan.settings.input_size))
        module, example = prepare(loaded, plan)
        report = bench_module(
            module,
            example,
            settings,
            name=loaded.name,
            source=ref.source.value,
            loss=loaded.loss,
            plan=plan,
        )
    render_bench(report, console)
    if json_path is not None:
        write_json(json_path, report, "--json")
        wrote((json_path,))
    if dashboard_json is not None:
        records = dashboard_records(report, ref.source.value)
        write_text(dashboard_json, json.dumps(records, indent=2) + "\n", "--dashboard-json")
        wrote((dashboard_json,))
