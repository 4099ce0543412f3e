"""What a sweep worker does for one model: build it, audit it, and describe it as a row.

Rows are built here, once, with everything they carry; the runner builds the rows of workers
that died (crash, timeout, memory cap) with the same ``failed_row``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cl_audit.enums import Mode, Stage, Status, TensorMode
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.execution.plan import plan_run
from cl_audit.execution.settings import AuditSettings
from cl_audit.report import ModelRow
from cl_audit.sources import BuildOptions, ModelRef, load_model
from cl_audit.sources.source_audit import audit_loaded
from cl_audit.sweep.footprint import call_site_files, factory_files, module_files

__all__ = ["Job", "SweepSettings", "audit_job", "failed_row", "parse_memory"]


@dataclass(frozen=True)
class SweepSettings:
    audit: AuditSettings = field(default_factory=AuditSettings)
    confirm: bool = False  # re-run in eager mode what fake mode flagged or failed
    max_input_size: int | None = 256
    timeout: float = 300.0
    max_memory_mb: float | None = 4096.0
    jobs: int = 2

    def __post_init__(self) -> None:
        if self.confirm and not self.audit.predicted:
            raise UsageError(
                "--confirm re-runs what fake mode flagged: use it with --fake (fake=True in Python)"
            )

    def to_dict(self) -> dict[str, Any]:
        """As the sweep report's ``settings`` records them."""
        data = asdict(self)
        audit = {k: getattr(v, "value", v) for k, v in data.pop("audit").items()}
        fake = audit.pop("tensor_mode") == TensorMode.FAKE.value
        return {**audit, "fake": fake, **data}


def parse_memory(text: str, option: str = "--max-memory") -> float:
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
        raise UsageError(f"{option} {text!r}: expected a size such as 2GB or 512MB")
    return value * units[unit]


@dataclass(frozen=True)
class Job:
    """One model to audit. A confirming job re-runs in eager mode a model fake mode flagged
    or failed; ``fake_verdict`` (what fake mode had flagged) then goes into a failure's message,
    so an eager failure does not hide the prediction."""

    ref: ModelRef
    settings: SweepSettings
    confirming: bool = False
    fake_verdict: str | None = None

    @property
    def mode(self) -> Mode:
        if self.confirming:
            return Mode.CONFIRMED
        return Mode.FAKE if self.settings.audit.predicted else Mode.EAGER


def failed_row(
    job: Job,
    status: Status,
    message: str,
    stage: Stage | None,
    seconds: float = 0.0,
    peak_memory_mb: float | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> ModelRow:
    """A row for a model that did not give a verdict: failed, or skipped with the reason."""
    if status.failed and job.fake_verdict:
        message = f"{message}; {job.fake_verdict}"
    return ModelRow(
        name=job.ref.name,
        source=job.ref.source,
        status=status,
        mode=job.mode,
        input_shape=input_shape,
        parameters=None,
        summary=None,
        offenders=(),
        message=message,
        stage=stage,
        seconds=seconds,
        peak_memory_mb=peak_memory_mb,
    )


def audit_job(
    job: Job,
    on_stage: Callable[[Stage], None] = lambda stage: None,
    on_files: Callable[[set[str]], None] | None = None,
) -> ModelRow:
    """Audit one model; every outcome, failures included, becomes a row. ``on_files``, if
    given, hears the source files the audit ran through as they become known (``footprint``):
    the factory's first, then the model's classes', then the row's call sites'."""
    start = time.perf_counter()
    _tell(on_files, lambda: factory_files(job.ref))
    try:
        row = _audit(job, on_stage, on_files, start)
    except UsageError as e:
        row = failed_row(job, Status.SKIPPED, str(e), None, _since(start))
    except ModelFailedError as e:
        row = failed_row(job, Status.ERROR, e.detail, e.stage, _since(start))
    # a user's module is imported now
    _tell(on_files, lambda: factory_files(job.ref) | call_site_files(row))
    return row


def _tell(on_files: Callable[[set[str]], None] | None, files: Callable[[], set[str]]) -> None:
    """Read the files (0.4-0.7 s a model, measured on timm) only for a listener."""
    if on_files is not None:
        on_files(files())


def _audit(
    job: Job,
    on_stage: Callable[[Stage], None],
    on_files: Callable[[set[str]], None] | None,
    start: float,
) -> ModelRow:
    settings = job.settings.audit
    if job.confirming:
        settings = replace(settings, tensor_mode=TensorMode.EAGER)
    plan = plan_run(settings)
    meta = plan.tensors.on_meta
    options = BuildOptions(
        max_input_size=job.settings.max_input_size,
        input_size=settings.input_size,
        meta=meta,
        skip_random_init=not meta,
    )
    on_stage(Stage.BUILD)
    loaded = load_model(job.ref, options)
    _tell(on_files, lambda: module_files(loaded.module))
    on_stage(Stage.FORWARD)
    try:
        report = audit_loaded(loaded, plan)
    except ModelFailedError:
        if not loaded.capped or settings.input_size is not None:
            raise
        # Some models cannot run below their own size (a patch size that does not divide the
        # cap, twin branches of fixed sizes): audit those at their own size.
        on_stage(Stage.BUILD)
        loaded = load_model(job.ref, replace(options, max_input_size=None))
        _tell(on_files, lambda: module_files(loaded.module))
        on_stage(Stage.FORWARD)
        report = audit_loaded(loaded, plan)
    return ModelRow.from_report(
        report,
        job.ref.name,
        job.ref.source,
        job.mode,
        parameters=sum(p.numel() for p in loaded.module.parameters()),
        seconds=_since(start),
    )


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 3)
