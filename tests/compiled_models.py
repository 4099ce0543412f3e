"""Tiny models for Inductor's layout decision (tests/test_compiled.py): one per branch of its
heuristic, each convolution called on a line of its own so that the report can name it."""

from __future__ import annotations

import torch
from torch import nn


class Plain(nn.Module):
    """A plain stack of wide convolutions: nothing vetoes channels_last."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 128, 3, padding=1)
        self.body = nn.Conv2d(128, 128, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.body(x)


class Grouped(Plain):
    """A grouped convolution with 8 input channels per group, most of the flops."""

    def __init__(self) -> None:
        super().__init__()
        self.grouped = nn.Conv2d(128, 128, 3, padding=1, groups=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.grouped(x)  # the deciding convolution
        return x


class Depthwise(Plain):
    """A depthwise convolution (one input channel per group): not grouped to the heuristic."""

    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(128, 128, 3, padding=1, groups=128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.depthwise(x)
        return self.body(x)


class Narrowing(Plain):
    """A 3x3 convolution from 256 to 64 channels (input >= 2x output, kernel > 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 256, 3, padding=1)
        self.narrow = nn.Conv2d(256, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.narrow(x)  # the deciding convolution
        return x


class Small(nn.Module):
    """Every convolution has at most 64 input and output channels."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, 32, 3, padding=1)
        self.second = nn.Conv2d(32, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        return self.second(x)


class Clip(nn.Module):
    """3-D convolutions: Inductor's lowering lays out only 2-D ones channels_last."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv3d(3, 128, 3, padding=1)
        self.body = nn.Conv3d(128, 128, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.body(x)


class Shuffled(Plain):
    """A channel shuffle: the ``.contiguous()`` of a transposed 5-D view of the channels_last
    map writes NCHW data, which the next convolution needs channels_last: eager loses the
    layout there, and Inductor's lowering copies the data back for the convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        n, c, h, w = x.shape
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous()  # the loss
        return self.body(x.view(n, c, h, w))


class Copied(Plain):
    """The control of ``Shuffled``: a plain ``.contiguous()`` between two convolutions, an eager
    loss that Inductor's lowering removes (the copy's layout is free, the convolution's wins)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).contiguous()  # the loss
        return self.body(x)


class Tokens(Plain):
    """Tokens mixed by a batched matmul, written in (B, C, HW) order and viewed as a map: eager
    finds no loss (the convolution converts its NCHW input itself), the lowering copies it to
    channels_last for the convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        n, c, h, w = x.shape
        tokens = x.flatten(2)
        mixed = torch.bmm(tokens, tokens.transpose(1, 2).softmax(-1) @ tokens)  # the data
        return self.body(mixed.view(n, c, h, w))


class HeldOutGrouped(nn.Module):
    """Held out from the compile work: a narrow stem, a grouped convolution of 4 channels per
    group carrying most of the flops, and a pointwise head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.mix = nn.Conv2d(64, 64, 5, padding=2, groups=16)
        self.head = nn.Conv2d(64, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mix(torch.relu(self.stem(x)))  # the grouped convolution
        return self.head(y)


class Selected(Plain):
    """The maps whose mean passes a threshold go on to the second convolution, as a detection
    model keeps the boxes that score: how many depends on the values (``aten.nonzero``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        kept = x[x.mean((1, 2, 3)) > -1e9]  # a boolean mask: its size is the data's
        return self.body(kept)
