"""The NCHW comparison: the same forward or step once more in NCHW. Its ledger against the
audited run's gives the cost and the verdict (``compare.cost_sites``); an inference forward also
sorts the terminal losses by their NCHW counterparts (``compare.differential``)."""

from __future__ import annotations

import torch

from cl_audit.compare.cost_sites import compare_ledgers
from cl_audit.compare.differential import CounterpartWatcher, classify_terminal
from cl_audit.enums import DifferentialStatus
from cl_audit.execution.audit_context import watching
from cl_audit.phases.audited import instrumented
from cl_audit.phases.subject import Compared, Sections, Subject
from cl_audit.report import DifferentialRun, Finding
from cl_audit.report.sections import Comparison
from cl_audit.rule.attribution import ModuleNames

__all__ = ["compare"]


def compare(subject: Subject, done: Sections) -> Compared:
    """The comparison's section. The patch engine, which sees no aten operation, only sorts
    terminal losses; a failed NCHW run is reported, with no cost weighed."""
    plan, run, model, loss = subject.plan, subject.run, subject.model, subject.loss
    audited = done.audited
    assert audited is not None  # the audited run comes first
    settings = plan.settings
    offenders = audited.observed.offenders
    if not settings.differential:
        return Compared(
            Comparison(DifferentialRun(DifferentialStatus.SKIPPED, "not asked for"), offenders)
        )
    if not settings.strategy.compared:
        skipped = DifferentialRun(DifferentialStatus.SKIPPED, "the model's format is the caller's")
        return Compared(Comparison(skipped, offenders))
    train = plan.workload.train
    terminal = tuple(f for f in offenders if f.terminal and not train)
    watcher = CounterpartWatcher(ModuleNames(model), terminal) if terminal else None
    ledger = audited.ledger
    if ledger is None and watcher is None:
        return Compared(Comparison(DifferentialRun(DifferentialStatus.NOT_NEEDED), offenders))
    nchw = None if ledger is None else ledger.alike()
    try:
        forward = run.nchw()
        if nchw is None:
            with torch.no_grad(), plan.autocast(), run.tensor_mode():
                with watching(settings.engine, watcher):
                    forward()
        else:
            quiet = plan.changed(timeline=False, time=False)
            step = run.stepper(quiet, forward, loss)
            with run.warming():
                step.warm_up()  # warmed up as the audited run was
            weighed = instrumented(quiet, model, run, nchw, watcher, findings=False)
            with run.tensor_mode(), weighed as (active, _):
                step.run(active)
    except Exception as e:
        message = f"the NCHW run failed ({type(e).__name__}: {e}"[:300] + "); no cost weighed"
        unaligned = sum(f.terminal for f in terminal)
        failed = DifferentialRun(DifferentialStatus.FAILED, message, unaligned=unaligned)
        return Compared(Comparison(failed, offenders))
    finally:
        run.restore()
    differential = DifferentialRun(DifferentialStatus.RAN)
    neutral: tuple[Finding, ...] = ()
    if watcher is not None:
        offenders, neutral, differential = classify_terminal(offenders, watcher)
    if ledger is None or nchw is None:
        return Compared(Comparison(differential, offenders, neutral), nchw)
    time_share = None if audited.timing is None else audited.timing.share
    first = run.example.first
    batch = first.shape[0] if first is not None and first.dim() else None
    cost = compare_ledgers(ledger, nchw, settings.gate, plan.device.type, batch, time_share)
    return Compared(Comparison(differential, offenders, neutral, cost), nchw)
