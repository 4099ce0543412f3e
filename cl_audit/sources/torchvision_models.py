"""torchvision models, built with random weights, with the input each takes: an image or clip
batch; for optical flow a pair of frames; for detection a list of images (the model's own
transform resizes and batches them), with synthetic targets when training (a box, its label, a
mask and 17 keypoints inside it per image, so that every loss runs)."""

from __future__ import annotations

import inspect

import torch

from cl_audit.enums import Stage
from cl_audit.errors import UsageError
from cl_audit.execution.inputs import Example
from cl_audit.rule.attribution import model_failed
from cl_audit.sources.refs import (
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
    kwargs: dict[str, object] = {"weights": None}
    if "weights_backbone" in inspect.signature(builder).parameters:
        kwargs["weights_backbone"] = None  # segmentation backbones default to downloading
    try:
        with building(options):
            module = builder(**kwargs)
    except Exception as e:
        raise model_failed(Stage.BUILD, name, e) from e
    shape = _input_shape(name, family, options.max_input_size)
    native = _input_shape(name, family, None)
    built_for = getattr(module, "image_size", None)  # ViTs: weights=None builds them for 224
    if isinstance(built_for, int) and built_for != shape[-1]:
        shape = native = (*shape[:-2], built_for, built_for)
    arguments = _ARGUMENTS.get(family)
    return LoadedModel(name, module, shape, capped=shape != native, arguments=arguments)


def _frame_pair(batch: torch.Tensor, train: bool) -> Example:
    """Optical flow: two frames (the second the first mirrored)."""
    return Example((batch, batch.flip(-1)))


def _target(image: torch.Tensor) -> dict[str, torch.Tensor]:
    """One object in the middle half of ``image``: its box, label, mask and 17 keypoints."""
    _, height, width = image.shape
    device = image.device
    x0, y0, x1, y1 = width / 4, height / 4, 3 * width / 4, 3 * height / 4
    mask = torch.zeros((1, height, width), dtype=torch.uint8, device=device)
    mask[:, height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = 1
    steps = torch.linspace(0, 1, 17, device=device)
    keypoints = torch.stack(
        [x0 + steps * (x1 - x0), y0 + steps * (y1 - y0), torch.ones(17, device=device)], dim=1
    )
    return {
        "boxes": torch.tensor([[x0, y0, x1, y1]], device=device),
        "labels": torch.ones(1, dtype=torch.int64, device=device),
        "masks": mask,
        "keypoints": keypoints[None],
    }


def _images(batch: torch.Tensor, train: bool) -> Example:
    """Detection: the batch as a list of images, with a target for each when training."""
    images = list(batch.unbind(0))
    if not train:
        return Example((images,))
    return Example((images, [_target(image) for image in images]))


_ARGUMENTS = {"optical_flow": _frame_pair, "detection": _images}
