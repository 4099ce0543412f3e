"""Training-framework callbacks (``cl_audit.integrations.fastai``, ``.lightning``), optional
extras imported only when used, and the one helper they share: ``StepAudit``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from cl_audit.enums import Phase
from cl_audit.execution.audit_context import Audit, audit
from cl_audit.execution.training import gradient_layouts
from cl_audit.report import ModelReport
from cl_audit.report.environment import autocast_in_effect
from cl_audit.report.files import write_json
from cl_audit.report.sections import Training

__all__ = ["StepAudit", "show"]


class StepAudit:
    """One training step of a framework audited across its hooks: ``start`` before the
    forward, ``backward`` and ``optimizer`` where those phases begin, ``gradients`` after the
    backward, ``stop`` when the step is over or failed (torch is then as it was), ``finish``
    for the report.

    The framework's own configuration is audited as it runs (nothing is converted). The
    autocast in effect is read when the first module runs, since frameworks enter it inside
    their step (Lightning's precision plugin, fastai's ``MixedPrecision``).
    """

    def __init__(self, model: nn.Module, *, name: str | None, optimizer: str | None) -> None:
        self.model, self.name, self.optimizer_name = model, name, optimizer
        self._audit: Audit | None = None
        self._running = False
        self._layouts: tuple[Any, ...] = ()
        self._autocast: str | None = None
        self._input_shape: tuple[int, ...] | None = None
        self._hook: Any = None

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        self._audit = audit(model=self.model, training=True)
        self._audit.__enter__()
        self._running = True
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._first_module)

    def _first_module(self, module: nn.Module, args: Any) -> None:
        self._autocast = autocast_in_effect()
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        self._input_shape = None if first is None else tuple(first.shape)
        self._remove_hook()

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def backward(self) -> None:
        if self._running and self._audit is not None:
            self._audit.enter_phase(Phase.BACKWARD)

    def gradients(self) -> None:
        if self._running:
            self._layouts = gradient_layouts(dict(self.model.named_parameters()))

    def optimizer(self) -> None:
        if self._running and self._audit is not None:
            self._audit.enter_phase(Phase.OPTIMIZER)

    def stop(self) -> None:
        """Leave the audit (and torch) as before ``start``; idempotent."""
        self._remove_hook()
        if self._running and self._audit is not None:
            self._running = False
            self._audit.__exit__(None, None, None)

    def finish(self) -> ModelReport:
        """Stop, and the report of what ran."""
        if self._audit is None:
            raise RuntimeError("StepAudit.finish() without start()")
        self.stop()
        return self._audit.report(
            model=self.name,
            input_shape=self._input_shape,
            autocast=self._autocast,
            training=Training(self.optimizer_name, self._layouts),
        )


def show(report: ModelReport, json_path: Path | None, console: Console | None = None) -> None:
    """Print the report's summary and offenders; write its JSON if asked."""
    from cl_audit.render.terminal import render_report

    render_report(report, console or Console())
    if json_path is not None:
        write_json(json_path, report, "json_path")
