"""fastai: ``ChannelsLastAudit``, a ``Callback`` that audits the first training batch of a fit
(forward, loss, backward, optimizer step) as the ``Learner`` runs it, with fastai's own
``ChannelsLast`` and ``MixedPrecision`` callbacks, and stores the report on the learner.

    cbs = [ChannelsLast(), MixedPrecision(), ChannelsLastAudit()]
    learn = vision_learner(dls, resnet34, cbs=cbs)
    learn.fit(1)
    learn.cl_audit_report.offenders

Install with ``pip install 'cl-audit[fastai]'``. fastai's ``ChannelsLast`` converts the model
only, so the batch reaches the first convolution in NCHW: the audit describes exactly that.
fastai's ``MixedPrecision`` enters ``autocast("cuda")``, which torch disables without CUDA; the
report's environment says which autocast actually ran.
"""

from __future__ import annotations

from pathlib import Path

from fastai.callback.core import Callback
from fastai.callback.fp16 import MixedPrecision

from cl_audit.integrations import StepAudit, show
from cl_audit.report import ModelReport
from cl_audit.report.files import write_json

__all__ = ["ChannelsLastAudit"]


class ChannelsLastAudit(Callback):
    """Audit the first training batch of each fit; the report goes to
    ``learn.cl_audit_report`` (and ``self.report``), its summary to the terminal (``show``),
    its JSON to ``json_path`` if given."""

    order = MixedPrecision.order + 1  # after ChannelsLast (-1) and MixedPrecision (10)

    def __init__(self, show: bool = True, json_path: str | Path | None = None) -> None:
        self.show = show
        self.json_path = None if json_path is None else Path(json_path)
        self.report: ModelReport | None = None
        self._audit_step: StepAudit | None = None

    def before_train(self) -> None:
        # fastai takes ``_do_one_batch`` before ``before_batch`` runs, so the first batch is
        # wrapped here: the audit is a ``with`` around it, exited whatever happens inside.
        if self.report is not None or "_do_one_batch" in vars(self.learn):
            return
        learn = self.learn
        original = learn._do_one_batch
        step = StepAudit(learn.model, name=type(learn.model).__name__, optimizer=_name(learn))

        def first_batch() -> None:
            del learn._do_one_batch  # later batches run fastai's own
            step.start()
            try:
                original()
            finally:
                step.stop()
            self._finish(step)

        learn._do_one_batch = first_batch
        self._audit_step = step

    def before_backward(self) -> None:
        if self._audit_step is not None:
            self._audit_step.backward()

    def after_backward(self) -> None:
        if self._audit_step is not None:
            self._audit_step.gradients()

    def before_step(self) -> None:
        if self._audit_step is not None:
            self._audit_step.optimizer()

    def after_fit(self) -> None:
        vars(self.learn).pop("_do_one_batch", None)  # a fit that ran no training batch
        self._audit_step = None

    def _finish(self, step: StepAudit) -> None:
        self._audit_step = None
        report = step.finish()
        self.report = report
        self.learn.cl_audit_report = report
        if self.show:
            show(report, self.json_path)
        elif self.json_path is not None:
            write_json(self.json_path, report, "json_path")


def _name(learn: object) -> str | None:
    opt_func = getattr(learn, "opt_func", None)
    return getattr(opt_func, "__name__", None)
