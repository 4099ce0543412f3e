"""torchvision models that take one image or clip tensor, built with random weights."""

from __future__ import annotations

import inspect

from cl_audit.enums import Stage
from cl_audit.errors import ModelFailedError, UsageError
from cl_audit.sources import (
    BuildOptions,
    LoadedModel,
    building,
    cap_input,
    close_matches,
    library,
)

__all__ = ["CHANNELS_LAST_TIER", "build", "names"]

# The models PyTorch's memory-format tutorial lists as supporting channels_last, and a few known
# not to: the tier that the slow tests and reports/torchvision/ cover.
CHANNELS_LAST_TIER = (
    "alexnet",
    "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3",
    "mobilenet_v2",
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "squeezenet1_0", "squeezenet1_1",
    "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
    "wide_resnet50_2", "wide_resnet101_2",
    "convnext_tiny", "efficientnet_b0", "vit_b_16", "maxvit_t", "deeplabv3_resnet50",
)  # fmt: skip

# Detection and optical-flow models take lists of images or image pairs, not one tensor.
_UNSUPPORTED_FAMILIES = {"detection": "a list of images", "optical_flow": "a pair of images"}
_VIDEO_FRAMES = 16  # torchvision's video models are documented with 16-frame clips
_DEFAULT_SIZE = 224


def names() -> list[str]:
    models = library("torchvision.models")

    return sorted(models.list_models())


def _family(builder: object) -> str:
    parts = getattr(builder, "__module__", "").split(".")
    return parts[2] if len(parts) > 3 else "classification"


def _input_shape(name: str, family: str, max_side: int | None) -> tuple[int, ...]:
    """The documented input size of the model's weights (299 for inception_v3), capped at
    ``max_side`` unless the weights' minimum size says the size is fixed (vit_b_16: 224)."""
    models = library("torchvision.models")

    try:
        weights = next(iter(models.get_model_weights(name)))
        transforms = weights.transforms()
        size = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None)
        frames = max(_VIDEO_FRAMES, weights.meta.get("min_temporal_size", 0))
        minimum = tuple(weights.meta.get("min_size", (1, 1)))
    except (ValueError, StopIteration):
        size, frames, minimum = None, _VIDEO_FRAMES, (1, 1)
    height = size[0] if size else _DEFAULT_SIZE
    width = size[-1] if size else _DEFAULT_SIZE
    shape = (3, frames, height, width) if family == "video" else (3, height, width)
    return shape if minimum == (height, width) else cap_input(shape, max_side)


def build(name: str, options: BuildOptions) -> LoadedModel:
    models = library("torchvision.models")

    available = names()
    if name not in available:
        hint = close_matches(name, available)
        raise UsageError(f"unknown torchvision model {name!r}{hint}; for a timm model use --timm")
    builder = models.get_model_builder(name)
    family = _family(builder)
    if family in _UNSUPPORTED_FAMILIES:
        raise UsageError(
            f"torchvision model {name!r} ({family}) takes {_UNSUPPORTED_FAMILIES[family]}, "
            "not one tensor: not supported"
        )
    kwargs: dict[str, object] = {"weights": None}
    if "weights_backbone" in inspect.signature(builder).parameters:
        kwargs["weights_backbone"] = None  # segmentation backbones default to downloading
    try:
        with building(options):
            module = builder(**kwargs)
    except Exception as e:
        raise ModelFailedError(Stage.BUILD, name, e) from e
    shape = _input_shape(name, family, options.max_input_size)
    native = _input_shape(name, family, None)
    built_for = getattr(module, "image_size", None)  # ViTs: weights=None builds them for 224
    if isinstance(built_for, int) and built_for != shape[-1]:
        shape = native = (*shape[:-2], built_for, built_for)
    return LoadedModel(name, module, shape, capped=shape != native)
