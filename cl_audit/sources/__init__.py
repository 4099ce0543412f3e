"""Where models come from: torchvision, timm, or the user's own ``module:factory``."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from torch import nn

__all__ = ["LoadedModel", "close_matches", "load_model"]


@dataclass(frozen=True)
class LoadedModel:
    """A built model (random weights) and its per-sample input shape, e.g. ``(3, 224, 224)``."""

    name: str
    source: str  # "torchvision", "timm" or "user"
    module: nn.Module
    input_shape: tuple[int, ...]


def close_matches(name: str, candidates: list[str]) -> str:
    """' (did you mean: a, b?)' or ''."""
    matches = difflib.get_close_matches(name, candidates, n=4, cutoff=0.6)
    return f" (did you mean: {', '.join(matches)}?)" if matches else ""


def load_model(spec: str, *, timm: bool = False) -> LoadedModel:
    """Build ``spec``: a timm name with ``timm``, ``module:factory`` or ``file.py:factory``
    when it holds a colon, a torchvision name otherwise."""
    if timm:
        from cl_audit.sources import timm_models

        return timm_models.build(spec)
    if ":" in spec:
        from cl_audit.sources import user

        return user.build(spec)
    from cl_audit.sources import torchvision_models

    return torchvision_models.build(spec)
