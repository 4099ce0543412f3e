"""A whole sweep: selected models in, a ``SweepReport`` out.

The session owns what a sweep decides beyond one model: the checkpoint (its default path,
``--resume``), the cache of earlier runs' rows (``--cache``: looked up before the first pass, a
row stored once it is final), the pass in fake or eager mode, the eager confirmation of what fake
mode flagged and its policy for large models, and the environment the report records.
Progress goes to the callbacks the caller gives; rendering and exit codes stay with the caller.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from cl_audit.enums import Mode, ModelSource, Status, TensorMode, Verdict
from cl_audit.errors import Terminated, UsageError
from cl_audit.execution.assemble import environment_of
from cl_audit.execution.plan import plan_run
from cl_audit.predict.divergences import HIDDEN_TRAINING_COPIES, DivergenceTable, divergence_table
from cl_audit.report import AppliedOverride, ModelRow, SweepReport
from cl_audit.report.sections import Training
from cl_audit.sources import ModelRef, library
from cl_audit.sweep.cache import SweepCache
from cl_audit.sweep.runner import Checkpoint, run_jobs
from cl_audit.sweep.selection import known_parameters
from cl_audit.sweep.worker import Job, SweepSettings

__all__ = [
    "CONFIRM_LARGE_SIDE",
    "LARGE_MODEL_PARAMETERS",
    "Progress",
    "SweepOutcome",
    "confirm_jobs",
    "default_checkpoint",
    "eager_only",
    "run_sweep",
]

LARGE_MODEL_PARAMETERS = 250_000_000  # confirmed in eager mode at CONFIRM_LARGE_SIDE px
CONFIRM_LARGE_SIDE = 160


class Progress(Protocol):
    """What a pass reports to: a model started, a row finished."""

    def start(self, ref: ModelRef) -> None: ...

    def finish(self, row: ModelRow) -> None: ...


# (models in this pass including those already done, already done, of those reused from the
# cache) -> a progress display
ProgressFactory = Callable[[int, int, int], AbstractContextManager[Progress]]


@dataclass(frozen=True)
class SweepOutcome:
    report: SweepReport
    interrupted: bool
    selected: int
    checkpoint: Path
    terminated: bool = False  # interrupted by SIGTERM


def default_checkpoint(
    json_path: Path | None, selection: dict[str, Any], settings: SweepSettings
) -> Path:
    """``--json``'s path plus ``.jsonl``, else a file named by a hash of the settings."""
    if json_path is not None and str(json_path) != "-":
        return json_path.with_name(json_path.name + ".jsonl")
    config = json.dumps([selection, settings.to_dict()], sort_keys=True, default=str)
    return Path(".cl-audit") / f"sweep-{hashlib.sha1(config.encode()).hexdigest()[:12]}.jsonl"


def _warm_imports(refs: list[ModelRef]) -> None:
    """Import once in the parent, so every forked worker starts warm."""
    import cl_audit.phases.audit_module  # noqa: F401

    library("torchvision.models")
    if any(ref.source is ModelSource.TIMM for ref in refs):
        library("timm")


def run_sweep(
    refs: list[ModelRef],
    settings: SweepSettings,
    selection: dict[str, Any],
    checkpoint_path: Path,
    resume: bool,
    progress: ProgressFactory,
    notify: Callable[[str], None],
    cache: SweepCache | None = None,
) -> SweepOutcome:
    """Audit every ref (those already in the checkpoint skipped with ``resume``, those whose
    row ``cache`` holds reused), confirm in eager mode what fake mode flagged when asked, and
    build the report; Ctrl-C ends the sweep with every finished row kept (``interrupted``)."""
    checkpoint = Checkpoint(checkpoint_path)
    wanted = {ref.key for ref in refs}
    done = {k: r for k, r in checkpoint.read().items() if k in wanted} if resume else {}
    checkpoint.start(keep=resume)
    rows: dict[str, ModelRow] = dict(done)
    reused: list[ModelRow] = []
    if cache is not None:
        reused = [r for ref in refs if ref.key not in done and (r := cache.lookup(ref))]
        rows.update((r.key, r) for r in reused)
        notify(f"{len(reused)} of {len(refs)} models reused from the cache {cache.root}")
    direct = eager_only(settings)
    if direct:
        notify(
            "a training sweep on this device confirms every model eagerly (its kernels copy "
            "inside, unseen by fake tensors): the fake pass is skipped, each model runs eagerly"
        )
    first = _eager_job if direct else Job
    jobs = [first(ref, settings) for ref in refs if ref.key not in rows]
    # Without a cache no worker reads the files its audit ran through.
    on_row = None if cache is None else _storing(cache, settings)

    interrupted = terminated = False
    try:
        _run_pass(jobs, settings.jobs, checkpoint, progress, rows, on_row, len(done), len(reused))
        if settings.confirm:
            _confirm(rows, settings, checkpoint, progress, notify, on_row)
    except KeyboardInterrupt as e:
        interrupted = True  # every finished row is already in ``rows`` and the checkpoint
        terminated = isinstance(e, Terminated)
    except UsageError as e:  # a write failed (a full disk): what is kept, and where
        kept = f"{len(rows)} finished rows are in the checkpoint {checkpoint.path}"
        raise UsageError(f"{e}; {kept} (--resume continues it)") from None
    finally:
        if cache is not None:
            cache.prune()
    audit = replace(settings.audit, tensor_mode=TensorMode.EAGER) if direct else settings.audit
    plan = plan_run(audit)  # its tensors name the mode: eager, fake, or fake-step (training)
    conditions = plan.conditions(audit.device, audit.dtype.value)
    if audit.predicted:
        conditions = replace(
            conditions,
            fake_divergences=divergence_table(audit.device.split(":")[0]).name,
            kernel_overrides=_applied_overrides(rows.values()),
        )
    training = Training(audit.optimizer.value) if audit.train else None
    environment = environment_of(conditions, training)
    report = SweepReport.build(
        environment, {**selection, **settings.to_dict()}, list(rows.values())
    )
    return SweepOutcome(report, interrupted, len(refs), checkpoint.path, terminated)


def eager_only(settings: SweepSettings) -> bool:
    """Whether the fake pass would be wasted: a confirmed training sweep on a device whose
    kernels copy inside unseen (``HIDDEN_TRAINING_COPIES``) re-runs every model eagerly
    (``confirm_jobs``), so each model runs once, eagerly, instead."""
    audit = settings.audit
    device = audit.device.split(":")[0]
    fake = audit.predicted
    return settings.confirm and audit.train and fake and device in HIDDEN_TRAINING_COPIES


def _storing(
    cache: SweepCache, settings: SweepSettings
) -> Callable[[ModelRow, frozenset[str]], None]:
    """What caches a row once it is final (not fake, or not to be confirmed), with every file
    its model's audits ran through."""
    ran_through: dict[str, set[str]] = {}

    def store(row: ModelRow, files: frozenset[str]) -> None:
        ran_through.setdefault(row.key, set()).update(files)
        unconfirmed = settings.confirm and row.mode is Mode.FAKE
        if not unconfirmed or not confirm_jobs({row.key: row}, settings):
            cache.store(row, ran_through[row.key])

    return store


def _eager_job(ref: ModelRef, settings: SweepSettings) -> Job:
    """An eager job in place of a fake one and its confirmation, with the confirmation's policy
    for large models (by the parameter counts shipped with the package)."""
    eager_audit = replace(settings.audit, tensor_mode=TensorMode.EAGER)
    eager = replace(settings, audit=eager_audit, confirm=False)  # nothing left to confirm
    large = known_parameters().get(ref.key, 0) > LARGE_MODEL_PARAMETERS
    return Job(ref, _at_confirmation_side(eager) if large else eager)


def _at_confirmation_side(settings: SweepSettings) -> SweepSettings:
    """``settings`` with the input capped at ``CONFIRM_LARGE_SIDE``, for large models."""
    side = min(settings.max_input_size or CONFIRM_LARGE_SIDE, CONFIRM_LARGE_SIDE)
    return replace(settings, max_input_size=side)


def _applied_overrides(rows: Iterable[ModelRow]) -> tuple[AppliedOverride, ...]:
    """The kernel-source overrides the rows applied, counted over the whole sweep."""
    counts: Counter[str] = Counter()
    sources: dict[str, str] = {}
    for row in rows:
        for override in row.kernel_overrides:
            counts[override.op] += override.applied
            sources[override.op] = override.source
    return tuple(AppliedOverride(op, counts[op], sources[op]) for op in sorted(counts))


def _divergent_ops(row: ModelRow, table: DivergenceTable) -> list[str]:
    """Ops of the row's findings that fake mode is known to get wrong in their phase (the
    divergence table of this torch and device): a regain there can be a loss in eager mode (an
    activation's backward given an NCHW gradient), so a clean fake verdict with one is not
    trusted."""
    findings = row.regains + row.parameter_conversions + row.format_neutral
    return sorted({f.op_id for f in findings if (f.op_id, f.phase.value) in table})


def confirm_jobs(rows: dict[str, ModelRow], settings: SweepSettings) -> list[Job]:
    """Eager re-runs of every model fake mode flagged or failed, or whose findings include an
    op of the divergence table, and in a training sweep on a device whose kernels copy inside
    unseen (``HIDDEN_TRAINING_COPIES``) every model; models over ``LARGE_MODEL_PARAMETERS`` at
    ``CONFIRM_LARGE_SIDE`` px. A failure's message keeps what fake mode had said."""
    smaller = _at_confirmation_side(settings)
    device = settings.audit.device.split(":")[0]
    table = divergence_table(device)
    hidden = HIDDEN_TRAINING_COPIES.get(device) if settings.audit.train else None
    jobs = []
    for row in rows.values():
        if row.cached:
            continue  # final when it was stored
        divergent = _divergent_ops(row, table) if row.status is Status.OK else []
        if hidden is not None and row.status is Status.OK and not divergent:
            divergent = [hidden]
        flagged = row.verdict is Verdict.OFFENDING  # bytes: what an eager re-run confirms
        if row.mode is not Mode.FAKE or not (flagged or row.status.failed or divergent):
            continue
        large = (row.parameters or 0) > LARGE_MODEL_PARAMETERS
        verdict = None
        if flagged and row.cost is not None:
            ops = sorted({s.op for s in row.cost.sites if s.extra})
            verdict = "fake mode had flagged: " + ", ".join(ops)
        elif flagged:
            verdict = "fake mode had flagged: " + ", ".join(sorted({f.op for f in row.offenders}))
        elif divergent:
            verdict = "fake mode was clean, with ops it is known to get wrong: " + ", ".join(
                divergent
            )
        ref = ModelRef(row.source, row.name)
        jobs.append(Job(ref, smaller if large else settings, True, verdict))
    return jobs


def _confirm(
    rows: dict[str, ModelRow],
    settings: SweepSettings,
    checkpoint: Checkpoint,
    progress: ProgressFactory,
    notify: Callable[[str], None],
    on_row: Callable[[ModelRow, frozenset[str]], None] | None,
) -> None:
    jobs = confirm_jobs(rows, settings)
    if jobs:
        notify(f"confirming {len(jobs)} models flagged in fake mode, in eager mode")
        _run_pass(jobs, settings.jobs, checkpoint, progress, rows, on_row)


def _run_pass(
    jobs: list[Job],
    parallel: int,
    checkpoint: Checkpoint,
    progress: ProgressFactory,
    rows: dict[str, ModelRow],
    on_row: Callable[[ModelRow, frozenset[str]], None] | None,
    already_done: int = 0,
    cached: int = 0,
) -> None:
    """One pass with its own progress display, which counts ``already_done`` (resumed) and
    ``cached`` (reused) rows as done; each row lands in ``rows`` as it finishes, and goes to
    ``on_row`` (if any) with the files its audit ran through."""
    if jobs:
        _warm_imports([job.ref for job in jobs])
    with progress(len(jobs) + already_done + cached, already_done + cached, cached) as display:

        def finished(row: ModelRow, files: frozenset[str]) -> None:
            rows[row.key] = row
            if on_row is not None:
                on_row(row, files)
            display.finish(row)

        def started(job: Job) -> None:
            display.start(job.ref)

        run_jobs(jobs, parallel, checkpoint, started, finished, footprint=on_row is not None)
