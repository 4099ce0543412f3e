"""Tiny modules for the differential audit, with the expected verdicts beside them.

Also usable as ``tests/differential_models.py:<factory>`` from the CLI.
"""

from __future__ import annotations

import torch
from torch import nn


class TalkingHeads(nn.Module):
    """cait's talking-heads attention: maps (B, heads, N, N) mixed over heads by a linear layer
    between two permutes come out with channels_last-ordered strides in any format, so the
    softmax after them copies the same way in NCHW: a format-neutral terminal loss."""

    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.stem = nn.Conv2d(3, dim, 3, padding=1)
        self.qk = nn.Linear(dim, 2 * dim)
        self.mix = nn.Linear(heads, heads)
        self.head = nn.Linear(heads, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.stem(x).flatten(2).transpose(1, 2)  # (B, N, C)
        b, n, c = tokens.shape
        q, k = self.qk(tokens).reshape(b, n, 2, self.heads, c // self.heads).unbind(2)
        attn = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)  # (B, heads, N, N), contiguous
        attn = self.mix(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # NHWC-ordered strides
        attn = attn.softmax(dim=-1)
        return self.head(attn.mean((2, 3)))


class FormatBranch(nn.Module):
    """Code that copies only when it sees channels_last input: nothing runs at that place in
    NCHW, so the terminal loss cannot be aligned and counts as caused."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if x.is_contiguous(memory_format=torch.channels_last):
            x = x.contiguous()
        return x.sum((2, 3))


class NCHWOnlyFails(nn.Module):
    """The NCHW run of the differential audit fails; the channels_last run has a terminal loss."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if not x.is_contiguous(memory_format=torch.channels_last):
            raise RuntimeError("this model refuses NCHW")
        return torch.flatten(x, 1)


def talking_heads() -> tuple[nn.Module, tuple[int, ...]]:
    return TalkingHeads(), (3, 8, 8)


def format_branch() -> tuple[nn.Module, tuple[int, ...]]:
    return FormatBranch(), (3, 8, 8)
