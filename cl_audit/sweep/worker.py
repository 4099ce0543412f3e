"""What a sweep worker does for one model: build it, audit it, and describe it as a row."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.report import Mode, ModelRow, Status
from cl_audit.run import RunSettings, audit_loaded
from cl_audit.sources import BuildOptions, load_model
from cl_audit.sweep.plan import ModelRef

__all__ = ["MIN_VERDICT_SIDE", "SweepSettings", "audit_ref", "failed_row"]

MIN_VERDICT_SIDE = 128  # below this, 1x1 maps make verdicts ambiguous (3 of 79 models flipped)


@dataclass(frozen=True)
class SweepSettings:
    run: RunSettings = field(default_factory=RunSettings)
    fake: bool = False
    confirm: bool = False
    max_input_size: int | None = 256
    timeout: float = 300.0
    max_memory_mb: float | None = 4096.0
    jobs: int = 2

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        run = data.pop("run")
        return {**{k: getattr(v, "value", v) for k, v in run.items()}, **data}


def failed_row(
    ref: ModelRef,
    mode: Mode,
    status: Status,
    message: str,
    stage: str | None,
    seconds: float = 0.0,
    peak_memory_mb: float | None = None,
) -> ModelRow:
    """A row for a model that did not give a verdict: failed, or skipped with the reason."""
    return ModelRow(
        name=ref.name,
        source=ref.source,
        status=status,
        mode=mode,
        predicted=mode is Mode.FAKE,
        input_shape=None,
        parameters=None,
        summary=None,
        offenders=(),
        message=message,
        stage=stage,
        seconds=seconds,
        peak_memory_mb=peak_memory_mb,
    )


def audit_ref(
    ref: ModelRef,
    settings: SweepSettings,
    mode: Mode,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> ModelRow:
    """Audit one model; every outcome, failures included, becomes a row."""
    start = time.perf_counter()
    try:
        return _audit(ref, settings, mode, on_stage, start)
    except UsageError as e:
        return replace(failed_row(ref, mode, Status.SKIPPED, str(e), None), seconds=_since(start))
    except ModelFailedError as e:
        message = f"{type(e.cause).__name__}: {e.cause}".strip()
        row = failed_row(ref, mode, Status.ERROR, message, e.stage)
        return replace(row, seconds=_since(start))


def _audit(
    ref: ModelRef,
    settings: SweepSettings,
    mode: Mode,
    on_stage: Callable[[str], None],
    start: float,
) -> ModelRow:
    from cl_audit.fake import audit_fake

    run = settings.run
    fake = mode is Mode.FAKE
    options = BuildOptions(
        max_input_size=settings.max_input_size, meta=fake, skip_random_init=not fake
    )
    on_stage("build")
    loaded = load_model(ref.name, timm=ref.source == "timm", options=options)
    shape = run.input_size or loaded.input_shape
    if run.input_size is None and min(shape[-2:]) < MIN_VERDICT_SIDE:
        side = "x".join(map(str, shape[-2:]))
        message = f"input {side} is below {MIN_VERDICT_SIDE} px, where 1x1 maps make "
        row = failed_row(ref, mode, Status.SKIPPED, message + "verdicts ambiguous", None)
        return replace(row, input_shape=(run.batch_size, *shape), seconds=_since(start))
    on_stage("forward")
    audit_one = audit_fake if fake else audit_loaded
    try:
        report = audit_one(loaded, run)
    except ModelFailedError:
        if not loaded.capped or run.input_size is not None:
            raise
        # Some models cannot run below their own size (a patch size that does not divide the
        # cap, twin branches of fixed sizes): audit those at their own size.
        on_stage("build")
        uncapped = replace(options, max_input_size=None)
        loaded = load_model(ref.name, timm=ref.source == "timm", options=uncapped)
        on_stage("forward")
        report = audit_one(loaded, run)
    return ModelRow(
        name=ref.name,
        source=ref.source,
        status=Status.OK,
        mode=mode,
        predicted=fake,
        input_shape=report.input_shape,
        parameters=sum(p.numel() for p in loaded.module.parameters()),
        summary=report.summary,
        offenders=report.offenders,
        message=None,
        stage=None,
        seconds=_since(start),
        peak_memory_mb=None,
    )


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 3)
