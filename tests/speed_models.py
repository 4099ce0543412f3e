"""Tiny models for the speed verdict: each operation class on its own beside a control without
it, and a model whose channels_last step is slower than its NCHW one by construction."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Convolutions(nn.Module):
    """Convolutions alone (and the ReLU between them)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))


class Pointwise(nn.Module):
    """No convolution: elementwise operations and a pool (the control of ``Convolutions``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.sigmoid(x) * x + 1.0, 2)


class Normalised(nn.Module):
    """A convolution, then batch norm (the class ``Convolutions`` lacks)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Attention(nn.Module):
    """A map made tokens, then scaled dot-product attention over them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.conv(x).flatten(2).transpose(1, 2).unflatten(-1, (2, 8)).transpose(1, 2)
        return F.scaled_dot_product_attention(t, t, t)


class Thrash(nn.Module):
    """Slower in channels_last by construction: each block writes its map NCHW
    (``contiguous()``: a full conversion in channels_last, nothing in NCHW) before a cheap
    depthwise convolution, which converts it back."""

    def __init__(self, blocks: int = 6, channels: int = 32) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 1)
        self.blocks = nn.ModuleList(
            nn.Conv2d(channels, channels, 1, groups=channels) for _ in range(blocks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for conv in self.blocks:
            x = conv(x.contiguous())
        return x


class Steady(Thrash):
    """``Thrash`` without the ``contiguous()`` (its control): nothing converts."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for conv in self.blocks:
            x = conv(x)
        return x


class ChannelsLastOnly(Steady):
    """``Steady`` refusing NCHW input: its channels_last run goes, its NCHW run fails, so no
    speed can be had."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous(memory_format=torch.channels_last):
            raise ValueError("this model takes channels_last input only")
        return super().forward(x)


def channels_last_only() -> nn.Module:
    return ChannelsLastOnly()


def thrash() -> nn.Module:
    return Thrash()


def steady() -> nn.Module:
    return Steady()
