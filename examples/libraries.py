"""Factories for models as people have them in popular libraries, each with its own example
input: ``cl-audit examples/libraries.py:smp_unet``. Random weights from the libraries' own
configurations (shipped with their packages), never a download: set ``YOLO_OFFLINE=1`` and
``HF_HUB_OFFLINE=1``. Install them with ``pip install -e '.[libraries]'``.
"""

from __future__ import annotations

import from_libraries
import torch
from torch import nn

Factory = tuple[nn.Module, object]


def _images(side: int, channels: int = 3) -> torch.Tensor:
    return torch.randn(2, channels, side, side, generator=torch.Generator().manual_seed(0))


# --- Ultralytics: YOLO from the yaml files the package ships -----------------------------------


def _yolo(config: str, task: str) -> Factory:
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel

    kind = SegmentationModel if task == "segment" else DetectionModel
    return kind(config, verbose=False), _images(320)


def yolo11n() -> Factory:
    return from_libraries.yolo()  # the README's example (320 px, like _yolo)


def yolo11n_seg() -> Factory:
    return _yolo("yolo11n-seg.yaml", "segment")


def yolov8n() -> Factory:
    return _yolo("yolov8n.yaml", "detect")


# --- diffusers: a small UNet2DConditionModel and AutoencoderKL -----------------------------------


def diffusers_unet() -> Factory:
    return from_libraries.unet()  # the README's example


def diffusers_vae() -> Factory:
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=16,
    )
    return vae, {"sample": _images(64)}


# --- segmentation_models_pytorch -----------------------------------------------------------------


def _smp(architecture: str) -> Factory:
    import segmentation_models_pytorch as smp

    model = getattr(smp, architecture)(encoder_name="resnet34", encoder_weights=None, classes=2)
    return model, _images(256)


def smp_unet() -> Factory:
    return _smp("Unet")


def smp_deeplabv3plus() -> Factory:
    return _smp("DeepLabV3Plus")


def smp_fpn() -> Factory:
    return _smp("FPN")


# --- MONAI: 3D networks, channels_last_3d ------------------------------------------------------


def _volume() -> torch.Tensor:
    return torch.randn(2, 1, 64, 64, 64, generator=torch.Generator().manual_seed(0))


def monai_unet() -> Factory:
    from monai.networks.nets import UNet

    model = UNet(
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        channels=(16, 32, 64, 128),
        strides=(2, 2, 2),
        num_res_units=2,
    )
    return model, _volume()


def monai_segresnet() -> Factory:
    from monai.networks.nets import SegResNet

    return SegResNet(spatial_dims=3, in_channels=1, out_channels=2, init_filters=8), _volume()


def monai_swinunetr() -> Factory:
    from monai.networks.nets import SwinUNETR

    model = SwinUNETR(in_channels=1, out_channels=2, feature_size=12, spatial_dims=3)
    return model, _volume()


# --- transformers: conv models from their default configurations ------------------------------


def _hf(model: str, config: str) -> Factory:
    import transformers

    built = getattr(transformers, model)(getattr(transformers, config)())
    return built, {"pixel_values": _images(224)}


def hf_convnext() -> Factory:
    return _hf("ConvNextModel", "ConvNextConfig")


def hf_segformer() -> Factory:
    return _hf("SegformerModel", "SegformerConfig")


def hf_resnet() -> Factory:
    return _hf("ResNetModel", "ResNetConfig")


def hf_mobilevit() -> Factory:
    return _hf("MobileViTModel", "MobileViTConfig")


# --- kornia and pytorchcv: libraries nobody here had tuned for (issue #59) ----------------------


class _DiskMaps(nn.Module):
    """kornia's DISK: its U-Net's heatmap and dense descriptors (instance norms throughout)."""

    def __init__(self) -> None:
        super().__init__()
        from kornia.feature import DISK

        self.disk = DISK()

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.disk.heatmap_and_dense_descriptors(images)


def kornia_disk() -> Factory:
    return _DiskMaps(), _images(128)


def pytorchcv_superpoint() -> Factory:
    from pytorchcv.model_provider import get_model

    # a softmax over the detector's channels, then Python loops over the keypoints
    return get_model("superpointnet", pretrained=False), _images(128, channels=1)


ALL = (
    "yolo11n", "yolo11n_seg", "yolov8n",
    "diffusers_unet", "diffusers_vae",
    "smp_unet", "smp_deeplabv3plus", "smp_fpn",
    "monai_unet", "monai_segresnet", "monai_swinunetr",
    "hf_convnext", "hf_segformer", "hf_resnet", "hf_mobilevit",
    "kornia_disk", "pytorchcv_superpoint",
)  # fmt: skip
