"""``cl-audit [audit] MODEL...``: its options resolved once into settings, then one model
audited in this process or a sweep, every output written, the outcome an exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from cl_audit.cli.console import AuditOutputs, console_beside, models_print_to_stderr, wrote
from cl_audit.cli.exits import EXIT, EXIT_CODES, exit_codes
from cl_audit.cli.options import (
    CACHE_MAX_FLAG,
    MODELS_HELP,
    NAMES_HELP,
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
    OptionalBool,
    OptionalPath,
    OptionalText,
    Patterns,
    audit_settings,
    compile_options,
    given,
    opt,
)
from cl_audit.cli.sweeps import run_sweep
from cl_audit.enums import DType, Engine, GateOn, Optimizer, Outcome, Strategy, TensorMode
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.execution.plan import RunPlan, plan_run
from cl_audit.execution.settings import parse_size
from cl_audit.report import FailedRun
from cl_audit.report.files import read_ops
from cl_audit.report.speed_report import undecided
from cl_audit.report.verdict import GATE_BATCH, Gate
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sweep.api import CacheOptions
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.worker import SweepSettings, parse_memory

if TYPE_CHECKING:
    from cl_audit.report.ops_report import OpsIndex

__all__ = ["AUDIT_HELP", "Distributed", "audit", "audit_command"]

# Options that only a sweep uses; given for one model they are reported as not applied.
SWEEP_ONLY = ("jobs", "timeout", "max_memory", "max_input_size", "checkpoint", "confirm")
CACHE_ONLY = frozenset({"cache_failures", "cache_max_size"})  # options that need --cache
AUDIT_HELP = (
    "Find the operations where a model's forward pass loses the channels_last format.\n\n"
    "Each model gets random weights and a random input; model and input are converted to "
    "channels_last (channels_last_3d for 5D), in eval mode under no_grad. One model prints its "
    "offenders; several (or --junit, --baseline, --shard, --resume, --cache) make a sweep, each "
    f"model in a worker of its own.\n\n{EXIT_CODES}"
)


class _Convert(str, Enum):
    """The strategies an audit can describe (``Strategy`` names them all)."""

    CHANNELS_LAST = Strategy.CHANNELS_LAST.value
    CONV_WEIGHTS = Strategy.CONV_WEIGHTS.value


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
    compile_mode: CompileMode = None,
    compile_backend: CompileBackend = "inductor",
    compile_dynamic: CompileDynamicOption = CompileDynamic.AUTO,
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
        settings = audit_settings(
            input_size, batch_size, device, dtype, amp, train, optimizer,
            strategy=Strategy(convert.value),
            time=time,
            engine=engine,
            tensor_mode=TensorMode.FAKE if fake else TensorMode.EAGER,
            differential=differential,
            timeline=html is not None,
            gate=Gate.of(fail_share, parse_size(fail_bytes), gate_batch, gate, fail_slowdown),
            compile=compile_,
            force_layout_opt=force_layout_opt,
            compile_options=compile_options(compile_mode, compile_backend, compile_dynamic),
            table=speed_table,
        )  # fmt: skip
        patterns = (tuple(p or ()) for p in (models, timm, torchvision, exclude))
        sweep = SweepSettings(
            settings, confirm, max_input_size, timeout, parse_memory(max_memory), jobs
        )
        outcome = audit(
            sweep,
            Selection(*patterns, shard_spec),
            AuditOutputs(json_path, html, junit, checkpoint, ops_index, baseline),
            resume=resume,
            list_only=list_only,
            show_all=show_all,
            verify=verify,
            distributed=Distributed(ddp, fsdp),
            given=frozenset(o for o in ctx.params if given(ctx, o)),
            console=console,
            cache=cache
            and CacheOptions(cache, cache_failures, parse_memory(cache_max_size, CACHE_MAX_FLAG)),
        )
    raise typer.Exit(EXIT[outcome])


@dataclass(frozen=True)
class Distributed:
    """The distributed checks asked for one model: ``--ddp``, ``--fsdp``."""

    ddp: bool = False
    fsdp: bool = False

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(f for f, on in (("--ddp", self.ddp), ("--fsdp", self.fsdp)) if on)

    def check(self, plan: RunPlan) -> None:
        """Refuse what the checks cannot run, before any model runs."""
        if not self.flags:
            return
        flags = " and ".join(self.flags)
        settings = plan.settings
        if not settings.train:
            raise UsageError(f"{flags} check a training step: give --train too")
        if settings.tensor_mode is not TensorMode.EAGER:
            raise UsageError(f"{flags} run for real on gloo processes: drop --fake")
        if plan.device.type != "cpu":
            raise UsageError(f"{flags} run on gloo processes on this CPU: drop --device")


def audit(
    sweep: SweepSettings,
    selection: Selection,
    outputs: AuditOutputs,
    *,
    resume: bool,
    list_only: bool,
    show_all: bool,
    given: frozenset[str],
    verify: bool | None = None,
    distributed: Distributed | None = None,
    console: Console,
    cache: CacheOptions | None = None,
) -> Outcome:
    """One model audited in this process, or a sweep (several models, or any of JUnit, a
    baseline, a shard, a resume, a cache), each model in a worker of its own; with
    ``list_only`` the selection is printed instead. ``given`` names the options given on the
    command line: sweep-only ones are reported as not applied to one model. ``verify`` (None:
    on for one model, off for a sweep) tries the remedies in what-if runs. The settings are
    planned (for a sweep, by its front door) before any model is built: a device that cannot
    run them is refused first."""
    stray = sorted(CACHE_ONLY & given) if cache is None else []
    if stray:
        flag = "--" + stray[0].replace("_", "-")
        raise UsageError(f"{flag} sets how --cache works: give --cache DIR too")
    refs = selection.refs()
    if list_only:
        for ref in refs:
            console.print(ref.key, highlight=False, soft_wrap=True)
        return Outcome.CLEAN
    if not refs:
        raise UsageError("no model selected: give a model name, --timm or --torchvision")
    outputs.check()
    sweeping = outputs.junit or outputs.baseline or resume or selection.shard or cache
    if len(refs) == 1 and not sweeping:
        unapplied = [o for o in SWEEP_ONLY if o in given]
        if unapplied:
            flags = ", ".join("--" + o.replace("_", "-") for o in unapplied)
            Console(stderr=True).print(
                f"note: {flags} {'applies' if len(unapplied) == 1 else 'apply'} to sweeps "
                "(several models, or --junit, --baseline, "
                "--shard, --resume): not applied to one model",
                highlight=False,
            )
        settings = replace(sweep.audit, verify=verify is not False)
        index = None if outputs.ops_index is None else read_ops(outputs.ops_index)
        distributed = distributed or Distributed()
        plan = plan_run(settings)
        distributed.check(plan)
        return _single(refs[0], plan, outputs, show_all, console, index, distributed)
    if distributed is not None and distributed.flags:
        flags = " and ".join(distributed.flags)
        raise UsageError(f"{flags} check one model's training step: give one model")
    if outputs.ops_index is not None:
        raise UsageError(
            "--ops-index links one model's report to the operator index; for a sweep: "
            "cl-audit ops --index FILE --from-sweep REPORT"
        )
    if sweep.audit.compile and not sweep.audit.time:
        raise UsageError(
            "--compile in a sweep times each model compiled: give --time --jobs 1 too (the "
            "layout decisions of its graphs are one model's report: give one model)"
        )
    if sweep.audit.time and sweep.jobs != 1:
        raise UsageError(
            f"--time in a sweep times one model at a time: models audited side by side share "
            f"the CPU, so their timings would not be comparable; give --jobs 1 (not {sweep.jobs})"
        )
    sweep = replace(sweep, audit=replace(sweep.audit, verify=bool(verify)))
    return run_sweep(refs, sweep, selection, outputs, resume, console, cache)


def _single(
    ref: ModelRef,
    plan: RunPlan,
    outputs: AuditOutputs,
    show_all: bool,
    console: Console,
    index: OpsIndex | None,
    distributed: Distributed,
) -> Outcome:
    from cl_audit.render.outputs import write_outputs
    from cl_audit.render.terminal import render_report
    from cl_audit.sources.source_audit import audit_loaded

    with models_print_to_stderr(), _failure_written(ref, outputs):
        loaded = load_model(
            ref, BuildOptions(input_size=plan.settings.input_size, meta=plan.tensors.on_meta)
        )
        report = audit_loaded(loaded, plan)
        if distributed.ddp:
            from cl_audit.features.distributed import ddp_check

            with console.status("the training step under DDP (gloo, 2 processes)"):
                report = replace(report, ddp=ddp_check(ref, plan))
        if distributed.fsdp:
            from cl_audit.features.distributed import fsdp_check

            with console.status("the FSDP pre-flight (gloo, 2 processes)"):
                report = replace(report, fsdp=fsdp_check(ref, plan))
    render_report(report, console, show_all, index)
    wrote(write_outputs(report, outputs.json, outputs.html, index=index))
    why = undecided(plan.settings.gate.on, report.speed)
    if why is not None:
        raise UsageError(f"`gate` speed cannot decide: the speed is unknown ({why})")
    return Outcome.OFFENDING if report.offending else Outcome.CLEAN


@contextlib.contextmanager
def _failure_written(ref: ModelRef, outputs: AuditOutputs) -> Iterator[None]:
    """A model that fails to build or run leaves a report saying so where its JSON and HTML
    were asked for (``FailedRun``), so that no earlier run's verdict stays there; the failure
    goes on (exit 3)."""
    try:
        yield
    except ModelFailedError as e:
        from cl_audit.render.outputs import write_failure

        write_failure(FailedRun(ref.name, e.stage, str(e)), outputs.json, outputs.html)
        raise
