"""Models that take more than one image tensor: what factories return as an example input."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Output:
    """Like diffusers' and transformers' output objects: tensors in named fields."""

    sample: torch.Tensor


class Conditioned(nn.Module):
    """An image, a timestep, an integer mask and a keyword embedding; the flatten of the
    channels_last map before the linear layer is the offender (a copy NCHW does not make)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.embed = nn.Linear(8, 4)
        self.head = nn.Linear(4 * 8 * 8, 10)

    def forward(
        self,
        pixel_values: torch.Tensor,
        timestep: torch.Tensor,
        mask: torch.Tensor,
        context: torch.Tensor | None = None,
    ) -> Output:
        if mask.dtype != torch.int64 or not mask.is_contiguous():
            raise AssertionError("the mask must be passed as given")
        y = self.conv(pixel_values) * mask + timestep.float().view(-1, 1, 1, 1)
        if context is not None:
            y = y + self.embed(context).view(-1, 4, 1, 1)
        return Output(self.head(torch.flatten(y, 1)))


def example() -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.randn(3, 3, 8, 8),
        "timestep": torch.tensor([1, 2, 3]),
        "mask": torch.ones(3, 1, 8, 8, dtype=torch.int64),
        "context": torch.randn(3, 8),
    }


def keywords() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Conditioned(), example()


def positional() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    e = example()
    return Conditioned(), (e["pixel_values"], e["timestep"], e["mask"])


def tensor_only() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()), torch.randn(3, 3, 8, 8)


def with_loss() -> tuple[nn.Module, dict[str, torch.Tensor], object]:
    return Conditioned(), example(), lambda output: output.sample.square().mean()


def not_an_example() -> tuple[nn.Module, str]:
    return Conditioned(), "pixels"
