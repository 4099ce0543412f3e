"""Lightning: ``ChannelsLastAudit``, a ``Callback`` that audits the first training batch of a
fit (forward, loss, backward, optimizer step) as the ``Trainer`` runs it, precision plugin
included; the summary is logged as metrics and the report saved as JSON in the log directory.

    trainer = Trainer(precision="bf16-mixed", callbacks=[ChannelsLastAudit(to_channels_last=True)])
    trainer.fit(module, loader)

Install with ``pip install 'cl-audit[lightning]'``. Lightning has no channels_last switch of
its own: ``to_channels_last=True`` converts the module in the callback's ``setup``, before the
strategy wraps it in DDP (whose gradient buckets take the strides the parameters have then),
as ``module.to(memory_format=torch.channels_last)`` does, and again at fit start for what
``configure_model`` built after it (the batch stays as the loader gives it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from cl_audit.execution.convert import to_channels_last
from cl_audit.integrations import StepAudit, show
from cl_audit.report import ModelReport
from cl_audit.report.files import write_json

__all__ = ["ChannelsLastAudit"]


class ChannelsLastAudit(pl.Callback):
    """Audit the first training batch; ``self.report`` holds the report, the trainer's loggers
    get its counts (``cl_audit/...``), ``filename`` in ``trainer.log_dir`` its JSON."""

    def __init__(
        self, to_channels_last: bool = False, show: bool = True, filename: str = "cl_audit.json"
    ) -> None:
        self.to_channels_last = to_channels_last
        self.show = show
        self.filename = filename
        self.report: ModelReport | None = None
        self.path: Path | None = None
        self._step: StepAudit | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # before the strategy wraps the module: DDP lays its gradient buckets out with the
        # strides the parameters have then (converted at fit start, they mismatch every step)
        if self.to_channels_last and stage == "fit":
            to_channels_last(pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.to_channels_last:  # what ``configure_model`` built after ``setup``
            to_channels_last(pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.report is not None or self._step is not None:
            return
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._step = StepAudit(
            pl_module,
            name=type(pl_module).__name__,
            optimizer=None if optimizer is None else type(optimizer).__name__,
        )
        self._step.start()

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._step is not None:
            self._step.backward()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._step is not None:
            self._step.gradients()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if self._step is not None:
            self._step.optimizer()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step, self._step = self._step, None
        if step is None or not step.running:
            return
        report = step.finish()
        self.report = report
        s = report.summary
        metrics = {
            "cl_audit/losses": float(s.losses),
            "cl_audit/round_trips": float(s.round_trips),
            "cl_audit/offending_ops": float(s.offending_ops),
            "cl_audit/bytes_converted": float(s.bytes_converted),
            "cl_audit/gradient_layouts": float(len(report.gradient_layouts)),
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        folder = Path(trainer.log_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / self.filename
        if self.show:
            show(report, self.path)
        else:
            write_json(self.path, report, "filename")

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop()  # torch as it was; the fit's exception goes on

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop()  # a fit that ended inside the first batch

    def _stop(self) -> None:
        if self._step is not None:
            self._step.stop()
            self._step = None
