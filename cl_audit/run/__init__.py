"""The one path that audits one model (``audit_module``) and the phases it walks (``phases``)."""
