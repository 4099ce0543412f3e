"""Remedies proven on the model: each change the catalogue names for a site of the cost table,
made at its line in a what-if run of the same forward in both layouts on the same input
(``cl_audit.compare.whatif``), is kept as the site's remedy only where it held.

A change holds when the model still runs in both layouts, each output equals the unchanged
model's in that layout within the output dtype's tolerance (``torch.testing``'s defaults), and
the channels_last-only bytes of the sites at its line (fixed there, or whose NCHW data began
there), counted against the unchanged NCHW run (the model a user compares with), fall by more
than it adds elsewhere. The what-if runs eagerly (a fake run has no values to compare): an
inference forward, or a whole training step (forward, loss, backward, optimizer step) from the
same parameters, buffers and random state each time, held to the unchanged step's loss and
gradients in the same layout. A training step whose two layouts disagree when unchanged (random
draws that follow the memory order: a dropout of a 4-D map) has no reference a change could be
held to: its remedies stay leads, saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from cl_audit.compare.cost_sites import compare_ledgers
from cl_audit.compare.kept import Kept, kept_advice, nearest, restrided
from cl_audit.compare.remedies import (
    KEEP_AS_IT_WAS,
    KEPT_PATTERNS,
    Match,
    SiteContext,
    matches,
    site_contexts,
)
from cl_audit.compare.whatif import CHANGES, Change, WhatIf
from cl_audit.enums import Evidence, RemedyStatus
from cl_audit.execution.plan import RunPlan
from cl_audit.execution.tensors import Forward, TensorRun
from cl_audit.execution.training import BoundStep
from cl_audit.intercept.ledger import Ledger
from cl_audit.phases.audited import instrumented
from cl_audit.phases.held import ACROSS, StepState, held_difference, over
from cl_audit.phases.subject import Compared, Sections, Subject
from cl_audit.report.sections import Comparison
from cl_audit.report.verdict import Cost, CostSite, Remedy, Trial
from cl_audit.rule.attribution import failure_summary

__all__ = ["TRIED_SITES", "verify"]

TRIED_SITES = 12  # the costliest call sites tried: the cost table's rows


class _Mode(Protocol):
    """A what-if change while inside: ``applied`` counts where it was made."""

    applied: int
    named: str | None

    def __enter__(self) -> object: ...

    def __exit__(self, *exc_info: object) -> None: ...


def _untried(plan: RunPlan) -> str | None:
    """Why the plan's remedies cannot be tried, or None."""
    if not plan.settings.verify:
        return "not tried: verification off (--no-verify, or a sweep without --verify)"
    if plan.tensors.predicted:
        return "not tried: a fake run computes no values to compare"
    return None


def verify(subject: Subject, done: Sections) -> Compared:
    """The comparison with its cost sites' remedies tried (see the module docstring)."""
    compared = done.comparison
    assert compared is not None  # the NCHW comparison comes first
    weights = done.audited.convolution_weights if done.audited is not None else frozenset()
    verified = _verified(subject, compared.comparison, compared.ledger, weights)
    return replace(compared, comparison=verified)


def _verified(
    subject: Subject, comparison: Comparison, nchw: Ledger | None, weights: frozenset[str]
) -> Comparison:
    plan, run, model, forward = subject.plan, subject.run, subject.model, subject.forward
    cost = comparison.cost
    if cost is None or not any(site.remedy for site in cost.sites):
        return comparison
    kept = restrided(model, weights)
    cost = _kept_leads(cost, kept)
    reason = _untried(plan)
    if reason is not None:
        return replace(comparison, cost=_noted(cost, reason, kept))
    assert nchw is not None  # a cost is weighed against the NCHW run's ledger
    started = time.perf_counter()
    baseline = _Baseline(plan, run, model, forward, cost, nchw, subject.loss)
    if baseline.incomparable is not None:
        return replace(comparison, cost=_noted(cost, baseline.incomparable, kept))
    contexts = site_contexts(
        ((s.module_path, s.kind, (s.op, s.aten_op)) for s in cost.sites if s.extra),
        plan.device.type,
    )
    top = _top_lines(cost.sites)
    trials: dict[tuple[str, str], Trial] = {}
    held: list[tuple[Match, Trial]] = []
    sites: list[CostSite] = []
    for site in cost.sites:
        if site.remedy is None:
            sites.append(site)
            continue
        tried: list[tuple[Match, Trial]] = []
        for match, line in _candidates(site, contexts[site.module_path]):
            if line is None or line not in top:
                continue
            for key, attempt in _attempts(match.changes, site, line, kept):
                if key not in trials:
                    trials[key] = attempt(baseline)
                if trials[key].applied or trials[key].failure is not None:
                    tried.append((match, trials[key]))  # else not the pattern it is written for
                    held.extend([(match, trials[key])] if trials[key].holds else [])
        sites.append(replace(site, remedy=_judged(site, tried, top)))
    sites = [_followed(site, held, baseline) for site in sites]
    seconds = round(time.perf_counter() - started, 2)
    return replace(comparison, cost=replace(cost, sites=tuple(sites), verify_seconds=seconds))


def _attempts(
    changes: tuple[str, ...], site: CostSite, line: str, kept: tuple[str, ...]
) -> list[tuple[tuple[str, str], Callable[[_Baseline], Trial]]]:
    """Each change to try for ``site`` at ``line`` as (its key, how to try it): a change of
    the line; or (``KEEP_AS_IT_WAS``) each restrided tensor nearest the site (``nearest``)
    kept as it was, weighed at the site itself."""
    attempts: list[tuple[tuple[str, str], Callable[[_Baseline], Trial]]] = []
    for name in changes:
        if name != KEEP_AS_IT_WAS:
            attempts.append(((line, name), lambda b, c=CHANGES[name]: b.trial(c, line)))
            continue
        place = f"{site.module_path} {line} {site.op}"
        for tensor in nearest(kept, site.module_path):
            key = (place, f"{name} {tensor}")
            attempts.append((key, lambda b, t=tensor: b.kept(t, site, line)))
    return attempts


def _candidates(site: CostSite, context: SiteContext) -> list[tuple[Match, str | None]]:
    """The catalogue entries matching the site, each with the line its changes are made at:
    the site's own or its fix site's, then those matching where its NCHW data began (a change
    upstream of the writer: coatnet's dropped ``.contiguous()`` before the attention)."""
    fix, root = site.fix_site, site.root_cause
    fix_ops = () if fix is None else (fix.python_op, fix.aten_op)
    found = [
        (match, fix.call_site if match.at_fix and fix is not None else site.call_site)
        for match in matches(site.kind, (site.op, site.aten_op), fix_ops, context)
    ]
    if root is not None:
        root_ops = (root.python_op, root.aten_op)
        found += [(match, root.call_site) for match in matches(site.kind, (), root_ops, context)]
    return found


def _kept_leads(cost: Cost, kept: tuple[str, ...]) -> Cost:
    """The leads that keep a restrided tensor as it was dropped where the model has none that
    the conversion restrided and no convolution took as its weight (``kept``)."""
    if kept:
        return cost
    sites = tuple(
        replace(s, remedy=None) if s.remedy is not None and s.remedy.pattern in KEPT_PATTERNS
        else s
        for s in cost.sites
    )  # fmt: skip
    return replace(cost, sites=sites)


def _noted(cost: Cost, reason: str, kept: tuple[str, ...]) -> Cost:
    """Each lead with why it was not tried; one that would keep a restrided tensor as it was
    names the tensors its trials would keep (``nearest`` its site)."""

    def note(site: CostSite) -> str:
        assert site.remedy is not None
        if site.remedy.pattern not in KEPT_PATTERNS:
            return reason
        return f"{reason} (it would keep one of: {', '.join(nearest(kept, site.module_path))})"

    sites = tuple(
        replace(s, remedy=replace(s.remedy, note=note(s))) if s.remedy is not None else s
        for s in cost.sites
    )
    return replace(cost, sites=sites)


def _top_lines(sites: tuple[CostSite, ...]) -> set[str]:
    """The lines of the costliest sites (and of their fix sites), as the cost table ranks
    them: at most ``TRIED_SITES`` call sites, each at least 1% of the cost."""
    total = sum(s.extra for s in sites)
    by_line: dict[str, int] = {}
    for site in sites:
        if site.call_site is not None and site.extra:
            by_line[site.call_site] = by_line.get(site.call_site, 0) + site.extra
    ranked = sorted(by_line, key=lambda line: -by_line[line])[:TRIED_SITES]
    lines = {line for line in ranked if by_line[line] * 100 >= total}
    return lines | {
        producer.call_site
        for s in sites
        if s.call_site in lines
        for producer in s.upstream
        if producer.call_site is not None
    }


def _judged(site: CostSite, tried: list[tuple[Match, Trial]], top: set[str]) -> Remedy:
    lead = site.remedy
    assert lead is not None
    if not tried:
        if site.call_site not in top:
            return replace(lead, note="not tried: not among the cost table's top sites")
        return replace(lead, note="not tried: no change made at run time carries it out")
    evidence = tuple(trial for _, trial in tried)
    held = [(match, trial) for match, trial in tried if trial.holds]
    if not held and all(match.remedy != lead for match, _ in tried):
        return replace(
            lead,
            evidence=evidence,
            note="not tried: no change made at run time carries it out; none held where its "
            "NCHW data began",
        )
    if not held:
        return replace(
            lead,
            status=RemedyStatus.REFUTED,
            evidence=evidence,
            note="no change tried holds: not offered as a fix",
        )
    match, best = min(held, key=lambda pair: pair[1].extra_bytes_after or 0)
    return Remedy(
        match.remedy.pattern,
        best.change,
        match.remedy.reference,
        RemedyStatus.VERIFIED,
        evidence,
    )


def _followed(site: CostSite, held: list[tuple[Match, Trial]], baseline: _Baseline) -> CostSite:
    """A site whose remedy was not proven takes the change that held where its NCHW data came
    from (a line of its fix site or root cause) and took the most of its bytes away in that
    change's what-if run: the remedy follows the fix site (an instance norm's, for the
    convolution backward reading its NCHW gradient), and a kernel matter is said only where
    none did."""
    if (site.remedy is not None and site.remedy.verified) or not site.extra:
        return site
    lines = {p.call_site for p in site.upstream if p.call_site is not None}
    found = [
        (_at_site(after.sites, site), match, trial)
        for match, trial in held
        if trial.line in lines
        and (after := baseline.after.get((trial.change, trial.line))) is not None
    ]
    left = [entry for entry in found if entry[0] < site.extra]
    if not left:
        return site
    _, match, trial = min(left, key=lambda entry: entry[0])
    remedy = Remedy(
        match.remedy.pattern, trial.change, match.remedy.reference, RemedyStatus.VERIFIED,
        (trial,),
    )  # fmt: skip
    return replace(site, remedy=remedy)


def _at_site(sites: tuple[CostSite, ...], site: CostSite) -> int:
    """The channels_last-only bytes at ``site``'s place (module, line and operation)."""
    place = (site.module_path, site.call_site, site.op, site.kind)
    return sum(s.extra for s in sites if (s.module_path, s.call_site, s.op, s.kind) == place)


def _at(sites: tuple[CostSite, ...], line: str) -> int:
    """The channels_last-only bytes of the sites at ``line``, fixed there or whose NCHW data
    began there."""
    return sum(
        s.extra
        for s in sites
        if s.call_site == line or any(p.call_site == line for p in s.upstream)
    )


class _Baseline:
    """The unchanged model's outputs in both layouts and its NCHW ledger (the comparison's: the
    same forward, weighed already): what each change is held to. A change's cost is its
    channels_last run against the unchanged NCHW one (the model a user compares with); its
    NCHW run only has to run and keep the NCHW output."""

    def __init__(
        self,
        plan: RunPlan,
        run: TensorRun,
        model: nn.Module,
        forward: Forward,
        cost: Cost,
        nchw: Ledger,
        loss: Callable[[Any], torch.Tensor] | None = None,
    ) -> None:
        self.plan, self.run, self.model, self.forward, self.cost = plan, run, model, forward, cost
        self.quiet = plan.changed(timeline=False, time=False)
        self.measured = cost.kernel_copies is Evidence.MEASURED
        self.ledger, self.loss = nchw, loss
        self.train = plan.workload.train
        self._kept: dict[str, _Ran] = {}  # each tensor kept as it was -> its runs
        self.after: dict[tuple[str, str], Cost] = {}  # (change, line) -> the cost with it made
        self._state = StepState(run) if self.train else None
        self.outputs = (self._run(forward, None), self._nchw())
        self.incomparable = self._incomparable()

    def _incomparable(self) -> str | None:
        """Why the unchanged training step is no reference, or None: its two layouts differ
        beyond ``ACROSS`` times the tolerance (random draws in memory order)."""
        if not self.train:
            return None
        difference, tolerance = held_difference(*self.outputs, self._dtype(), True)
        if difference <= ACROSS * tolerance:
            return None
        return (
            "not tried: the unchanged training step differs between the layouts "
            f"(max abs difference {difference:.3g} of its loss and gradients, over {ACROSS} "
            f"times the tolerance {tolerance:.3g}): random draws that follow the memory order "
            "leave no reference to hold a change to"
        )

    def _dtype(self) -> torch.dtype | None:
        """The dtype whose tolerance a training step is held to: autocast's, else each
        tensor's own (None)."""
        amp = self.plan.settings.amp
        return amp.torch_dtype if self.train and amp is not None else None

    def _run(self, forward: Forward, ledger: Ledger | None) -> object:
        """One forward as the audit ran it, under the checker when ``ledger`` is given; a
        training step from the state the what-if began with (``StepState``), giving its loss and
        its gradients by name."""
        outputs: list[object] = []

        def kept() -> object:
            outputs.append(forward())
            return outputs[-1]

        step = self.run.stepper(self.quiet, kept, self.loss)
        state = self._state
        if state is None:
            with self.run.tensor_mode():
                self._step(step, ledger)
            return outputs[0]
        try:  # the state put back even when a change breaks the step
            with self.run.tensor_mode(), StepState.seeded(self.plan):
                state.restore()
                self._step(step, ledger)
            loss = step.step.last_loss
            assert loss is not None  # a training step takes its loss
            return (loss.detach(), *state.gradients())
        finally:
            state.restore()

    def _step(self, step: BoundStep, ledger: Ledger | None) -> None:
        """The step, under the checker when ``ledger`` is given (findings kept: the ledger's
        causes say where each site's NCHW data began)."""
        if ledger is None:
            step.run(None)
            return
        with instrumented(self.quiet, self.model, self.run, ledger) as (active, _):
            step.run(active)

    def _nchw(self) -> object:
        forward = self.run.nchw()
        try:
            return self._run(forward, None)
        finally:
            self.run.restore()

    def trial(self, change: Change, line: str) -> Trial:
        """``change`` made at ``line`` in the channels_last forward (under the checker) and
        in the NCHW one."""
        ran = self._ran(lambda: WhatIf(change, line))
        advice = change.advice if ran.named is None else f"{change.advice}; here {ran.named}"
        return self._trial(advice, line, ran, lambda sites: _at(sites, line))

    def kept(self, name: str, site: CostSite, line: str) -> Trial:
        """The model's tensor ``name`` kept as it was in both forwards (a change of the
        conversion: run once), weighed at ``site`` (the sites of its place)."""
        ran = self._kept.get(name)
        if ran is None:
            ran = self._kept[name] = self._ran(lambda: Kept(self.model, name))
        return self._trial(kept_advice(name), line, ran, lambda sites: _at_site(sites, site))

    def _ran(self, mode: Callable[[], _Mode]) -> _Ran:
        """Both forwards with the change made (``mode``): its cost, or the failure."""
        ledger = Ledger(measured=self.measured)
        modes = (mode(), mode())
        layout = "channels_last"
        try:
            with modes[0]:
                changed = self._run(self.forward, ledger)
            layout = "NCHW"
            with modes[1]:
                changed_nchw = self._nchw()
            difference, tolerance = max(
                held_difference(changed, self.outputs[0], self._dtype(), self.train),
                held_difference(changed_nchw, self.outputs[1], self._dtype(), self.train),
                key=over,
            )
        except Exception as e:
            failure = f"in the {layout} run, {failure_summary(e)}"
            return _Ran(
                max(mode.applied for mode in modes), failure, None, None, None, modes[0].named
            )
        cost = self.cost
        after = compare_ledgers(ledger, self.ledger, cost.gate, self.plan.device.type, cost.batch)
        return _Ran(
            max(mode.applied for mode in modes), None, difference, tolerance, after, modes[0].named
        )

    def _trial(
        self, advice: str, line: str, ran: _Ran, at: Callable[[tuple[CostSite, ...]], int]
    ) -> Trial:
        """A change's runs weighed where ``at`` weighs (a line's sites, or one site's)."""
        cost, after = self.cost, ran.after
        before = at(cost.sites)
        if after is None:
            failure = ran.failure
            return Trial(advice, line, ran.applied, failure, None, None, before, None, None, None)
        self.after[advice, line] = after
        at_line = at(after.sites)
        moved = (after.extra_bytes - at_line) - (cost.extra_bytes - before)
        return Trial(
            advice, line, ran.applied, None, ran.difference, ran.tolerance, before, at_line,
            moved, after.extra_bytes,
        )  # fmt: skip


class _Ran(NamedTuple):
    """A change's what-if runs: where it was made, and the failure or the output's difference
    and the cost with it."""

    applied: int
    failure: str | None
    difference: float | None
    tolerance: float | None
    after: Cost | None
    named: str | None  # the operand the change was for, and where it was made
