"""timm models, built with ``pretrained=False``; imported on demand (timm is slow to import)."""

from __future__ import annotations

from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.sources import LoadedModel, close_matches

__all__ = ["build"]


def build(name: str) -> LoadedModel:
    import timm

    if not timm.is_model(name):
        hint = close_matches(name, timm.list_models())
        raise UsageError(f"unknown timm model {name!r}{hint}")
    try:
        module = timm.create_model(name, pretrained=False)
    except Exception as e:
        raise ModelFailedError("build", name, e) from e
    input_size = tuple(module.pretrained_cfg.get("input_size", (3, 224, 224)))
    return LoadedModel(name, "timm", module, input_size)
