"""cl-audit: find where a PyTorch model loses the channels_last memory format."""

from cl_audit.audit import Audit, audit
from cl_audit.errors import AuditError, ModelFailedError, UsageError
from cl_audit.layout import MemoryLayout, classify
from cl_audit.report import ModelReport, ReportFormatError
from cl_audit.run import audit_model
from cl_audit.settings import Engine

__all__ = [
    "Audit",
    "AuditError",
    "Engine",
    "MemoryLayout",
    "ModelFailedError",
    "ModelReport",
    "ReportFormatError",
    "UsageError",
    "audit",
    "audit_model",
    "classify",
]
