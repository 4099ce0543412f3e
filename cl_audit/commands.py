"""What each ``cl-audit`` command does once its options are settings: the package decides single
model against sweep, gates on baselines and writes every output; the CLI maps the ``Outcome``
(and the domain errors) to exit codes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from cl_audit.enums import Outcome, Status, TensorMode
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.execution.plan import RunPlan, plan_run
from cl_audit.files import (
    check_writable,
    read_ops,
    read_sweep,
    write_json,
)
from cl_audit.render.wording import plural
from cl_audit.report import FailedRun, SweepReport, compare, merge
from cl_audit.report.speed_report import undecided
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sweep import api as sweep_api
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.worker import SweepSettings

if TYPE_CHECKING:
    from cl_audit.report.ops_report import OpsIndex

__all__ = [
    "AuditOutputs",
    "Distributed",
    "audit",
    "merge_reports",
    "models_print_to_stderr",
    "wrote",
]

# Options that only a sweep uses; given for one model they are reported as not applied.
SWEEP_ONLY = ("jobs", "timeout", "max_memory", "max_input_size", "checkpoint", "confirm")
CACHE_ONLY = frozenset({"cache_failures", "cache_max_size"})  # options that need --cache


@dataclass(frozen=True)
class AuditOutputs:
    json: Path | None = None
    html: Path | None = None
    junit: Path | None = None
    checkpoint: Path | None = None
    ops_index: Path | None = None  # a saved operator index one model's report is linked to

    def check(self) -> None:
        """Refuse an unwritable path before any model runs."""
        for path, option in ((self.json, "--json"), (self.junit, "--junit"), (self.html, "--html")):
            check_writable(path, option)


def audit(
    sweep: SweepSettings,
    selection: Selection,
    outputs: AuditOutputs,
    *,
    baseline: Path | None,
    resume: bool,
    list_only: bool,
    show_all: bool,
    given: frozenset[str],
    verify: bool | None = None,
    distributed: Distributed | None = None,
    console: Console,
    cache: sweep_api.CacheOptions | None = None,
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
    if len(refs) == 1 and not (outputs.junit or baseline or resume or selection.shard or cache):
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
    if sweep.audit.compile:
        raise UsageError(
            "--compile explains one model's compiled graphs: give one model (sweeps do not take it)"
        )
    if sweep.audit.time:
        raise UsageError(
            "--time times one model: models audited side by side in a sweep share the "
            "CPU, so their timings would not be comparable"
        )
    sweep = replace(sweep, audit=replace(sweep.audit, verify=bool(verify)))
    return _sweep(refs, sweep, selection, outputs, baseline, resume, console, cache)


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
        loaded = load_model(ref, BuildOptions(meta=plan.tensors.on_meta))
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


def _sweep(
    refs: list[ModelRef],
    settings: SweepSettings,
    selection: Selection,
    outputs: AuditOutputs,
    baseline_path: Path | None,
    resume: bool,
    console: Console,
    cache: sweep_api.CacheOptions | None,
) -> Outcome:
    from cl_audit.render.outputs import write_outputs
    from cl_audit.render.progress import SweepProgress
    from cl_audit.render.terminal_sweep import render_sweep

    err = Console(stderr=True)
    baseline = read_sweep(baseline_path) if baseline_path is not None else None
    with models_print_to_stderr():
        outcome = sweep_api.sweep(
            refs,
            settings,
            selection,
            checkpoint=outputs.checkpoint,
            json_path=outputs.json,
            resume=resume,
            cache=cache,
            progress=lambda total, done, cached: SweepProgress(err, total, done, cached),
            notify=err.print,
        )
    report = outcome.report
    render_sweep(report, console)
    try:
        wrote(write_outputs(report, outputs.json, outputs.html, outputs.junit))
    except UsageError as e:  # checked before the sweep, so a full disk: every row is kept
        raise UsageError(f"{e}; every row is in the checkpoint {outcome.checkpoint}") from None
    if outcome.interrupted:
        how = "terminated (SIGTERM)" if outcome.terminated else "interrupted"
        err.print(
            f"{how}: {report.summary.models} of {outcome.selected} models done; "
            f"checkpoint {outcome.checkpoint} (--resume continues it)"
        )
        return Outcome.TERMINATED if outcome.terminated else Outcome.INTERRUPTED
    on = settings.audit.gate.on
    unknown = [(r.name, why) for r in report.models if r.status is Status.OK
               if (why := undecided(on, r.speed)) is not None]  # fmt: skip
    if unknown:
        name, why = unknown[0]
        raise UsageError(
            f"`gate` speed cannot decide {plural(len(unknown), 'model')} of "
            f"{report.summary.models}: the speed is unknown ({name}: {why})"
        )
    if baseline is not None:
        return _gate(baseline, report, console)
    return _verdict(report)


def _gate(baseline: SweepReport, report: SweepReport, console: Console) -> Outcome:
    """New offences or failures against ``baseline`` offend; anything else is clean."""
    from cl_audit.render.terminal_sweep import render_comparison

    comparison = compare(baseline, report)
    render_comparison(comparison, console)
    return Outcome.OFFENDING if comparison.regressed else Outcome.CLEAN


def _verdict(report: SweepReport) -> Outcome:
    s = report.summary
    if s.offending:
        return Outcome.OFFENDING
    if s.failed:
        return Outcome.FAILED
    if s.models and s.skipped == s.models:
        reason = next(r.message for r in report.models)
        raise UsageError(f"no model was audited: all {s.models} were skipped ({reason})")
    return Outcome.CLEAN


def merge_reports(
    paths: list[Path], output: Path, *, force: bool, baseline: Path | None, console: Console
) -> Outcome:
    """Merge sweep reports into ``output``; with ``baseline``, gate the merged report on it."""
    previous = read_sweep(baseline) if baseline is not None else None
    merged = merge([read_sweep(path) for path in paths], force=force)
    write_json(output, merged, "--output")
    wrote((output,))
    s = merged.summary
    console.print(
        f"merged {len(paths)} reports: {s.models} models, {s.offending} offending, "
        f"{s.failed} failed"
    )
    return Outcome.CLEAN if previous is None else _gate(previous, merged, console)


def models_print_to_stderr() -> contextlib.AbstractContextManager[object]:
    """What models and their libraries print while they are built and run goes to stderr:
    stdout is cl-audit's (``--json -`` stays pure JSON; Ultralytics announces its settings)."""
    return contextlib.redirect_stdout(sys.stderr)


def wrote(paths: tuple[Path, ...]) -> None:
    """Say on stderr which files were written (not stdout's '-')."""
    for path in paths:
        if str(path) != "-":
            Console(stderr=True).print(f"wrote {path}", highlight=False, soft_wrap=True)
