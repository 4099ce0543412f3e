"""A sweep run from the command line (each model in a worker of its own, progress on stderr,
every output written, the outcome decided) and a sweep report gated on a baseline."""

from __future__ import annotations

from rich.console import Console

from cl_audit.cli.console import AuditOutputs, models_print_to_stderr, wrote
from cl_audit.enums import Outcome, Status
from cl_audit.errors import UsageError
from cl_audit.render.outputs import write_outputs
from cl_audit.render.progress import SweepProgress
from cl_audit.render.terminal_sweep import render_comparison, render_sweep
from cl_audit.render.wording import plural
from cl_audit.report import SweepReport, compare
from cl_audit.report.files import read_sweep
from cl_audit.report.speed_report import undecided
from cl_audit.sources import ModelRef
from cl_audit.sweep import api as sweep_api
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.worker import SweepSettings

__all__ = ["gate", "run_sweep"]


def run_sweep(
    refs: list[ModelRef],
    settings: SweepSettings,
    selection: Selection,
    outputs: AuditOutputs,
    resume: bool,
    console: Console,
    cache: sweep_api.CacheOptions | None,
) -> Outcome:
    """Audit ``refs`` in workers, render and write the report; the outcome: interrupted,
    against the baseline when there is one, else the sweep's own verdict."""
    err = Console(stderr=True)
    baseline = read_sweep(outputs.baseline) if outputs.baseline is not None else None
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
        return gate(baseline, report, console)
    return _verdict(report)


def gate(baseline: SweepReport, report: SweepReport, console: Console) -> Outcome:
    """New offences or failures against ``baseline`` offend; anything else is clean."""
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
