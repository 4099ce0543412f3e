"""Where models come from: torchvision, timm, or the user's own ``module:factory``; a reference's
types are in ``refs``, each source's builder in its own module."""

from __future__ import annotations

from cl_audit.enums import ModelSource
from cl_audit.sources.refs import (
    BuildOptions,
    LoadedModel,
    ModelRef,
    cap_input,
    close_matches,
    library,
    positional_source,
)

__all__ = [
    "BuildOptions",
    "LoadedModel",
    "ModelRef",
    "cap_input",
    "close_matches",
    "library",
    "load_model",
    "positional_source",
]


def load_model(ref: ModelRef, options: BuildOptions | None = None) -> LoadedModel:
    """Build the model ``ref`` names, with random weights (or none, on the meta device)."""
    options = options or BuildOptions()
    if ref.source is ModelSource.TIMM:
        from cl_audit.sources import timm_models

        return timm_models.build(ref.name, options)
    if ref.source is ModelSource.USER:
        from cl_audit.sources import user

        return user.build(ref.name, options)
    from cl_audit.sources import torchvision_models

    return torchvision_models.build(ref.name, options)
