"""The front door of sweeps: ``sweep`` (the CLI and the Python API both come here), and
``cl_audit.audit_models``, a sweep from Python as ``cl-audit`` runs it, without a terminal."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path

from cl_audit.enums import Amp, Optimizer, TensorMode
from cl_audit.errors import UsageError
from cl_audit.execution.plan import plan_run
from cl_audit.execution.settings import AuditSettings
from cl_audit.report import ModelRow, SweepReport
from cl_audit.report.files import check_folder, check_writable
from cl_audit.report.verdict import GATE_BATCH, Gate
from cl_audit.sources import ModelRef
from cl_audit.sweep.cache import DEFAULT_CACHE_MB, SweepCache
from cl_audit.sweep.selection import Selection
from cl_audit.sweep.session import (
    Progress,
    SweepOutcome,
    default_checkpoint,
    eager_only,
    run_sweep,
)
from cl_audit.sweep.worker import SweepSettings, parse_memory

__all__ = ["CacheOptions", "audit_models", "sweep"]


class _Silent:
    def start(self, ref: ModelRef) -> None:
        pass

    def finish(self, row: ModelRow) -> None:
        pass


@contextlib.contextmanager
def _silent(total: int, done: int, cached: int) -> Iterator[Progress]:
    yield _Silent()


@dataclass(frozen=True)
class CacheOptions:
    """``--cache DIR``: earlier sweeps' rows reused while their model files, settings and
    versions are unchanged; failures too with ``failures``; at most ``max_mb`` on disk."""

    root: Path
    failures: bool = False
    max_mb: float = DEFAULT_CACHE_MB


def sweep(
    refs: list[ModelRef],
    settings: SweepSettings,
    selection: Selection,
    *,
    checkpoint: Path | None = None,
    json_path: Path | None = None,
    resume: bool = False,
    cache: CacheOptions | None = None,
    progress: Callable[[int, int, int], AbstractContextManager[Progress]] = _silent,
    notify: Callable[[str], None] = lambda message: None,
) -> SweepOutcome:
    """The one front door of sweeps, for the CLI and ``audit_models`` alike: ``refs`` (of
    ``selection``) audited in workers, the checkpoint at ``checkpoint`` or next to
    ``json_path``, rows reused from ``cache``. The settings are planned (the device resolved)
    and the checkpoint and the cache checked here, before any model runs (``UsageError``)."""
    direct = eager_only(settings)  # then no fake pass runs: plan what does run
    plan_run(replace(settings.audit, tensor_mode=TensorMode.EAGER) if direct else settings.audit)
    chosen = selection.to_dict()
    if checkpoint is None and (json_path is None or str(json_path) == "-"):
        checkpoint = default_checkpoint(json_path, chosen, settings)
        check_folder(checkpoint.parent, "the default checkpoint")  # cl-audit's own folder
    else:
        checkpoint = checkpoint or default_checkpoint(json_path, chosen, settings)
        check_writable(checkpoint, "--checkpoint")
    if cache is not None:
        check_folder(cache.root, "--cache")
    return run_sweep(
        refs,
        settings,
        chosen,
        checkpoint,
        resume,
        progress,
        notify,
        cache=None
        if cache is None
        else SweepCache(cache.root, settings, failures=cache.failures, max_mb=cache.max_mb),
    )


def audit_models(
    models: Sequence[str] = (),
    *,
    timm: Sequence[str] = (),
    torchvision: Sequence[str] = (),
    exclude: Sequence[str] = (),
    shard_spec: str | None = None,
    fake: bool = False,
    confirm: bool = False,
    device: str = "cpu",
    train: bool = False,
    amp: Amp | str | None = None,
    optimizer: Optimizer | str = Optimizer.SGD,
    fail_share: float = 100 * Gate.share,
    fail_bytes: int = Gate.bytes,
    gate_batch: int = GATE_BATCH,
    jobs: int = 2,
    timeout: float = 300.0,
    max_memory: str = "4GB",
    max_input_size: int = 256,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    cache: str | Path | None = None,
    cache_failures: bool = False,
    cache_max_size: str = f"{DEFAULT_CACHE_MB:g}MB",
) -> SweepReport:
    """Audit many models, each in a worker of its own, as ``cl-audit`` sweeps do: ``models``
    are torchvision names or ``module:factory`` specs, ``timm`` and ``torchvision`` names,
    globs or ``"all"``; ``shard_spec`` is ``"K/N"``. With ``cache`` (a folder), rows of earlier
    sweeps are reused while each model's source files, the settings and the versions are
    unchanged (``ModelRow.cached``). Raises ``UsageError`` for a bad selection or setting;
    a model that fails is a row. Ctrl-C (KeyboardInterrupt) goes on after the workers are
    stopped; the checkpoint keeps every finished row (``resume=True`` continues it)."""
    settings = SweepSettings(
        audit=AuditSettings(
            device=device,
            tensor_mode=TensorMode.FAKE if fake else TensorMode.EAGER,
            gate=Gate.of(fail_share, fail_bytes, gate_batch),
            amp=None if amp is None else Amp(amp),
            train=train,
            optimizer=Optimizer(optimizer),
        ),
        confirm=confirm,
        max_input_size=max_input_size,
        timeout=timeout,
        max_memory_mb=parse_memory(max_memory),
        jobs=jobs,
    )
    chosen = Selection(tuple(models), tuple(timm), tuple(torchvision), tuple(exclude), shard_spec)
    refs = chosen.refs()
    if not refs:
        raise UsageError("no model selected: give models, timm or torchvision")
    outcome = sweep(
        refs,
        settings,
        chosen,
        checkpoint=Path(checkpoint) if checkpoint else None,
        resume=resume,
        cache=None
        if cache is None
        else CacheOptions(
            Path(cache), cache_failures, parse_memory(cache_max_size, "cache_max_size")
        ),
    )
    if outcome.interrupted:
        raise KeyboardInterrupt
    return outcome.report
