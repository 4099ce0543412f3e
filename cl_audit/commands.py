"""What each ``cl-audit`` command does once its options are settings: the package decides single
model against sweep, gates on baselines and writes every output; the CLI maps the ``Outcome``
(and the domain errors) to exit codes.
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from cl_audit.enums import DType, OpBehaviour, Outcome, TensorMode, Verdict
from cl_audit.errors import UsageError
from cl_audit.execution.plan import RunPlan, plan_run
from cl_audit.files import (
    check_writable,
    read_ops,
    read_report,
    read_sweep,
    write_json,
    write_text,
)
from cl_audit.report import SweepReport, compare, merge
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sweep import api as sweep_api
from cl_audit.sweep.selection import Selection, select
from cl_audit.sweep.worker import SweepSettings

if TYPE_CHECKING:
    from cl_audit.features.bench import BenchSettings
    from cl_audit.report.ops_report import OpsIndex

__all__ = [
    "AuditOutputs",
    "Distributed",
    "OpsOutputs",
    "OpsSources",
    "audit",
    "bench",
    "merge_reports",
    "ops",
    "ops_diff",
    "render",
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
                f"note: {flags} apply to sweeps (several models, or --junit, --baseline, "
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

    with _models_print_to_stderr():
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
    _wrote(write_outputs(report, outputs.json, outputs.html, index=index))
    return Outcome.OFFENDING if report.verdict is Verdict.OFFENDING else Outcome.CLEAN


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
    with _models_print_to_stderr():
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
        _wrote(write_outputs(report, outputs.json, outputs.html, outputs.junit))
    except UsageError as e:  # checked before the sweep, so a full disk: every row is kept
        raise UsageError(f"{e}; every row is in the checkpoint {outcome.checkpoint}") from None
    if outcome.interrupted:
        err.print(
            f"interrupted: {report.summary.models} of {outcome.selected} models done; "
            f"checkpoint {outcome.checkpoint} (--resume continues it)"
        )
        return Outcome.INTERRUPTED
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
    with _models_print_to_stderr():
        loaded = load_model(ref)
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
        _wrote((json_path,))
    if dashboard_json is not None:
        records = dashboard_records(report, ref.source.value)
        write_text(dashboard_json, json.dumps(records, indent=2) + "\n", "--dashboard-json")
        _wrote((dashboard_json,))


def merge_reports(
    paths: list[Path], output: Path, *, force: bool, baseline: Path | None, console: Console
) -> Outcome:
    """Merge sweep reports into ``output``; with ``baseline``, gate the merged report on it."""
    previous = read_sweep(baseline) if baseline is not None else None
    merged = merge([read_sweep(path) for path in paths], force=force)
    write_json(output, merged, "--output")
    _wrote((output,))
    s = merged.summary
    console.print(
        f"merged {len(paths)} reports: {s.models} models, {s.offending} offending, "
        f"{s.failed} failed"
    )
    return Outcome.CLEAN if previous is None else _gate(previous, merged, console)


@dataclass(frozen=True)
class OpsSources:
    """Where ``cl-audit ops`` reads from besides torch: a saved index to use instead of
    running one, and sweep reports whose losses it ranks."""

    index: Path | None = None
    sweeps: tuple[Path, ...] = ()


@dataclass(frozen=True)
class OpsOutputs:
    """Where ``cl-audit ops`` writes the index besides the terminal: JSON ('-': stdout), HTML."""

    json: Path | None = None
    html: Path | None = None


def ops(
    patterns: tuple[str, ...],
    loses: bool,
    device: str,
    dtype: DType,
    outputs: OpsOutputs,
    sources: OpsSources,
    console: Console,
) -> None:
    """The operator coverage index of the installed torch on ``device`` (predicted on fake
    tensors for a CUDA device this machine lacks), or the one saved at ``sources.index``,
    printed (the rows matching ``patterns``; with ``loses`` those that lose channels_last or
    refuse it) and written whole to ``outputs`` (the operators ``patterns`` chose); with
    ``sources.sweeps``, the operations their losses cost most, beside the index's rows."""
    from cl_audit.features.ops_index.probe import select
    from cl_audit.features.ops_index.ranking import rank_costs
    from cl_audit.render.ops_table import render_op_costs, render_ops

    json_path = outputs.json
    if json_path is not None and str(json_path) != "-":
        check_writable(json_path, "--json")
    if outputs.html is not None:
        check_writable(outputs.html, "--html")
    sweeps = [read_sweep(path) for path in sources.sweeps]
    if sources.index is not None:
        if device != "cpu" or dtype is not DType.FLOAT32:
            raise UsageError("--index reads a saved index: --device and --dtype do not apply")
        index = read_ops(sources.index)
    else:
        index = _run_index(patterns, device, dtype, console)
    wanted = (OpBehaviour.LOSES, OpBehaviour.REFUSES) if loses else ()
    rows = select(index, patterns, wanted)
    if not select(index, patterns):
        raise UsageError(f"no operator with a 4-D or 5-D sample matches {', '.join(patterns)}")
    if sweeps:
        render_op_costs(index, rank_costs(index, sweeps), console)
    else:
        render_ops(index, rows, console)
    if json_path is not None:
        write_json(json_path, index, "--json")
        _wrote((json_path,))
    if outputs.html is not None:
        from cl_audit.render.html_ops import ops_html

        write_text(outputs.html, ops_html(index), "--html")
        _wrote((outputs.html,))


def _run_index(patterns: tuple[str, ...], device: str, dtype: DType, console: Console) -> OpsIndex:
    from cl_audit.compat.opinfo import module_entries, operator_entries, opinfo_problem
    from cl_audit.features.ops_index.probe import build_index, target_for

    problem = opinfo_problem()
    if problem is not None:
        raise UsageError(problem)
    target = target_for(device)
    entries = itertools.chain(
        operator_entries("cpu", dtype.torch_dtype), module_entries("cpu", dtype.torch_dtype)
    )
    if patterns:  # only the operators asked for are run
        entries = (e for e in entries if any(fnmatch.fnmatchcase(e.name, p) for p in patterns))
    with console.status("running every operator's samples"):
        return build_index(entries, target, dtype.torch_dtype)


def ops_diff(old: Path, new: Path, console: Console) -> None:
    """The operators whose behaviour differs between two saved indexes, printed."""
    from cl_audit.features.ops_index.diff import diff
    from cl_audit.render.ops_table import render_ops_diff

    before, after = read_ops(old), read_ops(new)
    render_ops_diff(before, after, diff(before, after), console)


def render(report_path: Path, html: Path, ops_index: Path | None = None) -> None:
    """A saved report (any version, model or sweep) as one self-contained HTML file; a model's
    linked to the rows of the operator index saved at ``ops_index``."""
    from cl_audit.render.outputs import write_outputs

    check_writable(html, "--html")
    report = read_report(report_path)
    index = None if ops_index is None else read_ops(ops_index)
    if index is not None and isinstance(report, SweepReport):
        raise UsageError(
            "--ops-index links one model's report; for a sweep: "
            "cl-audit ops --index FILE --from-sweep REPORT"
        )
    _wrote(write_outputs(report, html=html, index=index))


def _models_print_to_stderr() -> contextlib.AbstractContextManager[object]:
    """What models and their libraries print while they are built and run goes to stderr:
    stdout is cl-audit's (``--json -`` stays pure JSON; Ultralytics announces its settings)."""
    return contextlib.redirect_stdout(sys.stderr)


def _wrote(paths: tuple[Path, ...]) -> None:
    """Say on stderr which files were written (not stdout's '-')."""
    for path in paths:
        if str(path) != "-":
            Console(stderr=True).print(f"wrote {path}", highlight=False, soft_wrap=True)
