"""Tiny models for the bench and --time tests: one with a deliberate round trip whose copies
are most of its step, one with two copies of very different sizes, and a strategy probe."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class RoundTrip(nn.Module):
    """A 1x1 convolution, then ``contiguous()`` (a loss: a full copy of a wide map), then a
    convolution again (the regain): the copy is a large share of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(3, 64, 1)
        self.reduce = nn.Conv2d(64, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(self.expand(x).contiguous())


def round_trip() -> tuple[nn.Module, tuple[int, ...]]:
    return RoundTrip(), (3, 96, 96)


class TwoCopies(nn.Module):
    """Two terminal copies: a small map's and one 256 times larger."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Conv2d(3, 4, 1, stride=16)
        self.large = nn.Conv2d(3, 64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.small(x).contiguous(), self.large(x).contiguous()


class StrategyProbe(nn.Module):
    """A 3x3 and a 1x1 convolution and a 4D parameter that is not a convolution weight; the
    forward logs the input's and the weight's formats in ``LOG``, a class attribute that the
    bench's deep copies share, to tell which configuration ran when."""

    LOG: ClassVar[list[tuple[bool, bool]]] = []

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pointwise = nn.Conv2d(8, 8, 1)
        self.scale = nn.Parameter(torch.ones(1, 8, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cl = torch.channels_last
        StrategyProbe.LOG.append(
            (x.is_contiguous(memory_format=cl), self.conv.weight.is_contiguous(memory_format=cl))
        )
        y = self.pointwise(self.conv(x))
        return y * self.scale.sum()
