"""timm models, built with ``pretrained=False``; imported on demand (timm is slow to import)."""

from __future__ import annotations

from cl_audit.enums import Stage
from cl_audit.errors import UsageError
from cl_audit.rule.attribution import model_failed
from cl_audit.sources.refs import (
    BuildOptions,
    LoadedModel,
    building,
    cap_input,
    close_matches,
    library,
)

__all__ = ["build", "names"]


def names() -> list[str]:
    return library("timm").list_models()


def build(name: str, options: BuildOptions) -> LoadedModel:
    timm = library("timm")
    get_pretrained_cfg = library("timm.models").get_pretrained_cfg
    if not timm.is_model(name):
        raise UsageError(f"unknown timm model {name!r}{close_matches(name, names())}")
    cfg = get_pretrained_cfg(name)
    default = tuple(cfg.input_size) if cfg is not None else (3, 224, 224)
    cap = cap_input(default, options.max_input_size)
    wanted = options.input_size if options.input_size is not None else cap
    shape = wanted if len(wanted) == len(default) else default
    kwargs: dict[str, object] = {}
    if shape[-2:] != default[-2:] and cfg is not None and cfg.fixed_input_size:
        kwargs["img_size"] = shape[-2:]  # models with position embeddings are built for it
    try:
        with building(options):
            try:
                module = timm.create_model(name, pretrained=False, **kwargs)
            except TypeError:
                if not kwargs:
                    raise
                shape = default  # this model cannot be built smaller: keep its own size
                module = timm.create_model(name, pretrained=False)
    except Exception as e:
        raise model_failed(Stage.BUILD, name, e) from e
    return LoadedModel(name, module, shape, capped=options.input_size is None and shape != default)
