"""cl-audit: what channels_last costs a PyTorch model against NCHW, and where to fix it."""

from cl_audit.compiled.graphs import compiled_layouts
from cl_audit.enums import Engine, Verdict
from cl_audit.errors import AuditError, ModelFailedError, UsageError
from cl_audit.execution.audit_context import Audit, audit
from cl_audit.integrations.assertion import assert_keeps_channels_last
from cl_audit.phases.audit_module import audit_model
from cl_audit.registry import OpClass, register_operator
from cl_audit.report import Compiled, Cost, CostSite, ModelReport, ReportFormatError
from cl_audit.rule.layout import MemoryLayout, classify
from cl_audit.sweep.api import audit_models

__all__ = [
    "Audit",
    "AuditError",
    "Compiled",
    "Cost",
    "CostSite",
    "Engine",
    "MemoryLayout",
    "ModelFailedError",
    "ModelReport",
    "OpClass",
    "ReportFormatError",
    "UsageError",
    "Verdict",
    "assert_keeps_channels_last",
    "audit",
    "audit_model",
    "audit_models",
    "classify",
    "compiled_layouts",
    "register_operator",
]
