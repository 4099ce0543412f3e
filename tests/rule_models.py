"""Tiny modules for the corrected rule, each paired with a control, with the expected answers.

Also usable as ``tests/rule_models.py:<factory>`` from the CLI: each factory returns
``(module, input shape without the batch)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BmmSameSize(nn.Module):
    """efficientvit_msra's attention at its 4x4 stage: tokens (16) == key dim (16), so the bmm's
    output has as many elements as its channels_last-storage input. Not a copy: no loss."""

    def __init__(self, copy: bool = False) -> None:
        super().__init__()
        self.copy = copy
        self.qk = nn.Conv2d(3, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).split(16, dim=1)  # channels_last (B, 16, 4, 4)
        q, k = q.flatten(2), k.flatten(2)  # (B, 16, 16) views of channels_last storage
        if self.copy:
            return k.contiguous()  # the control: a same-size copy of that view is a loss
        return (q.transpose(-2, -1) @ k).softmax(dim=-1)


class ResnestSplit(nn.Module):
    """resnest's split attention: a 5D reshaped view of channels_last data summed over the radix
    comes out NCHW (a loss whatever its size); the next convolution converts it back."""

    def __init__(self, slices: bool = False) -> None:
        super().__init__()
        self.slices = slices
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        b, c, h, w = x.shape
        if self.slices:
            x = x[:, : c // 2] + x[:, c // 2 :]  # the control: the same sum, channels_last kept
        else:
            x = x.reshape(b, 2, c // 2, h, w).sum(dim=1)
        return self.after(x)


class SkStack(nn.Module):
    """skresnet's selective kernel: a stack of two channels_last maps summed over the paths."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 5, padding=2)
        self.after = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.stack([self.a(x), self.b(x)], dim=1).sum(dim=1)
        return self.after(x)


class StdConv2d(nn.Conv2d):
    """timm's weight-standardised convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,
            None,
            training=True,
            momentum=0.0,
            eps=1e-6,
        ).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class WeightStandardization(nn.Module):
    """The standardised weight copies the channels_last weight out NCHW (a parameter loss, and a
    regain in the convolution); the softmax over channels is an activation loss."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = StdConv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.conv(x), dim=1)


class PosEmbed(nn.Module):
    """volo: a (1, H, W, C) position embedding (channels_last after conversion, being 4D) added
    to NHWC tokens: a loss whose only channels_last input is the parameter."""

    def __init__(self, size: int = 8, channels: int = 8) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, channels, 2, stride=2)
        self.pos_embed = nn.Parameter(torch.randn(1, size, size, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).permute(0, 2, 3, 1)
        return x + self.pos_embed


class RelativeBias(nn.Module):
    """A relative position bias gathered from a table with an index buffer, permuted to
    (1, heads, N, N) without a copy (so channels_last-ordered), added to the attention logits."""

    def __init__(self, size: int = 4, channels: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        n = size * size
        self.patch = nn.Conv2d(3, channels, 4, stride=4)
        self.qk = nn.Linear(channels, 2 * channels)
        self.table = nn.Parameter(torch.randn((2 * size - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij"))
        relative = (coords.flatten(1)[:, :, None] - coords.flatten(1)[:, None, :]) + size - 1
        self.register_buffer("index", relative[0] * (2 * size - 1) + relative[1])
        assert self.index.shape == (n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)  # (B, N, C)
        b, n, _ = tokens.shape
        q, k = self.qk(tokens).reshape(b, n, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        bias = self.table[self.index].permute(2, 0, 1).unsqueeze(0)  # (1, heads, N, N)
        return (q @ k.transpose(-2, -1) + bias).softmax(dim=-1)


class CoordGrid(nn.Module):
    """A coordinate-grid buffer (channels_last after conversion) flattened: a parameter loss."""

    def __init__(self, size: int = 16) -> None:
        super().__init__()
        coords = torch.stack(
            torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
        )
        self.register_buffer("grid", coords.unsqueeze(0))  # (1, 2, H, W)
        self.conv = nn.Conv2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv(x), torch.flatten(self.grid, 1)


class QKVCopies(nn.Module):
    """q, k and v each copied out NCHW by the same line (one finding, count 3); attention over
    them is regained by the projection, so each of the three copies is a round trip."""

    def __init__(self, channels: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Conv2d(3, channels, 1)
        self.k = nn.Conv2d(3, channels, 1)
        self.v = nn.Conv2d(3, channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        b, c, h, w = t.shape
        return t.reshape(b, self.heads, c // self.heads, h * w).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        q, k, v = (self.split_heads(t) for t in (self.q(x), self.k(x), self.v(x)))
        attn = (q.transpose(-2, -1) @ k).softmax(dim=-1)  # (B, heads, N, N)
        out = v @ attn.transpose(-2, -1)  # (B, heads, d, N)
        return self.proj(out.reshape(b, -1, h, w))


class TokensToMap(nn.Module):
    """Pooled features through a linear layer, viewed back to NCHW (contiguous 4D data made by a
    view, not by a loss) and convolved: a regain whose source is that view."""

    def __init__(self, channels: int = 4, size: int = 8) -> None:
        super().__init__()
        self.channels, self.size = channels, size
        self.conv = nn.Conv2d(3, channels, 1)
        self.fc = nn.Linear(channels, channels * size * size)
        self.after = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(self.conv(x).mean((2, 3)))
        return self.after(y.view(-1, self.channels, self.size, self.size))


def bmm_same_size() -> tuple[nn.Module, tuple[int, ...]]:
    return BmmSameSize(), (3, 4, 4)


def resnest_split() -> tuple[nn.Module, tuple[int, ...]]:
    return ResnestSplit(), (3, 16, 16)


def sk_stack() -> tuple[nn.Module, tuple[int, ...]]:
    return SkStack(), (3, 16, 16)


def weight_standardization() -> tuple[nn.Module, tuple[int, ...]]:
    return WeightStandardization(), (3, 16, 16)


def pos_embed() -> tuple[nn.Module, tuple[int, ...]]:
    return PosEmbed(), (3, 16, 16)


def relative_bias() -> tuple[nn.Module, tuple[int, ...]]:
    return RelativeBias(), (3, 16, 16)


def coord_grid() -> tuple[nn.Module, tuple[int, ...]]:
    return CoordGrid(), (3, 16, 16)


def qkv_copies() -> tuple[nn.Module, tuple[int, ...]]:
    return QKVCopies(), (3, 8, 8)


def tokens_to_map() -> tuple[nn.Module, tuple[int, ...]]:
    return TokensToMap(), (3, 8, 8)
