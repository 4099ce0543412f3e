"""Models for the DDP checks (``--ddp``): built in each rank's process from this file."""

from __future__ import annotations

import torch
from torch import nn


class SmallConvNet(nn.Module):
    """A 3x3 convolution, a 1x1 one (its weight is N1HW-ambiguous: size-1 spatial dims), batch
    norm and a classifier: the parameters DDP buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 1),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def small_conv_net() -> tuple[nn.Module, tuple[int, ...]]:
    return SmallConvNet(), (3, 16, 16)
