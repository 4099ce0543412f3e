"""Small models whose channels_last behaviour is known, with the expected answers beside them.

Also usable as ``tests/toy_models.py:<factory>`` from the CLI.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ChannelShuffle(nn.Module):
    """The shufflenet pattern: a 5D view of NHWC data copied out contiguous, then convolved."""

    def __init__(self, channels: int = 8, groups: int = 2) -> None:
        super().__init__()
        self.groups = groups
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.after = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        n, c, h, w = x.shape
        x = x.view(n, self.groups, c // self.groups, h, w).transpose(1, 2).contiguous()
        x = x.view(n, c, h, w)
        return self.after(x)


class FlattenHead(nn.Module):
    """Conv, then flatten of a spatial map into a linear layer: a terminal loss."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.classifier = nn.Linear(8 * 16 * 16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 16), 1))


class PooledBranch(nn.Module):
    """deeplabv3's ASPP pooling: batch norm gives the NC11 map NCHW strides (C, 1, 1, 1) on
    CPU, so the map interpolated back to full size comes out NCHW."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.project = nn.Sequential(
            nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.project(F.adaptive_avg_pool2d(x, 1))
        return F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False)


class MixedConcat(nn.Module):
    """A cat of a channels_last branch with the NCHW pooled branch: loss with a root cause."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = PooledBranch()
        self.project = nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return self.project(torch.cat([x, self.pool(x)], dim=1))


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels // 2, 1)
        self.expand = nn.Conv2d(channels // 2, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(scale))))


class CleanNet(nn.Module):
    """Keeps channels_last throughout: SE on NC11 maps, a spatial gate, permute + LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.se = SqueezeExcite(8)
        self.gate = nn.Conv2d(8, 1, 1)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.se(F.relu(self.bn(self.stem(x))))
        x = x * torch.sigmoid(self.gate(x))
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return x[:, :4] + x[:, 4:]


class Broken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this model is broken on purpose")


class Interrupting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.conv(x)
        raise KeyboardInterrupt


def channel_shuffle() -> tuple[nn.Module, tuple[int, ...]]:
    return ChannelShuffle(), (3, 16, 16)


def clean_net() -> tuple[nn.Module, tuple[int, ...]]:
    return CleanNet(), (3, 16, 16)


def broken() -> nn.Module:
    return Broken()


def failing_factory() -> nn.Module:
    raise ValueError("cannot build this one")


def not_a_module() -> str:
    return "resnet50"


class DictOutput(nn.Module):
    """Returns a dict and a tuple, like segmentation and multi-head models."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        y = self.conv(x)
        return {"out": (y, F.softmax(y, dim=1))}


def dict_output() -> tuple[nn.Module, tuple[int, ...]]:
    return DictOutput(), (3, 8, 8)


def interrupting() -> tuple[nn.Module, tuple[int, ...]]:
    return Interrupting(), (3, 8, 8)


def batched_shape() -> tuple[nn.Module, tuple[int, ...]]:
    """A common mistake: the input shape given with its batch."""
    return CleanNet(), (2, 3, 16, 16)


class NeedsAnOptionalPackage(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import a_package_that_is_not_installed  # noqa: F401

        return x


def batched_shape_missing_import() -> tuple[nn.Module, tuple[int, ...]]:
    """A 4-dim shape, and a forward that fails for a reason unrelated to the input."""
    return NeedsAnOptionalPackage(), (2, 3, 16, 16)
