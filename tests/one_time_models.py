"""Tiny modules that do work once, on their first forward: it must not be charged to the
layout that runs first. Each has a control whose work is done on every forward, in channels_last
only, which must still be flagged."""

from __future__ import annotations

import importlib
import sys

import torch
from torch import nn

HELPER = "one_time_helper"


class ImportsLazily(nn.Module):
    """Imports a helper inside its forward (a library loaded on first use), whose module-level
    code writes a table row by row."""

    def __init__(self) -> None:
        super().__init__()
        sys.modules.pop(HELPER, None)  # imported afresh by this model's first forward
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        helper = importlib.import_module(HELPER)
        return self.conv(x) + helper.TABLE[0, 0]


class CachesStatistics(nn.Module):
    """Per-channel statistics of its first input taken from an NCHW copy of it and cached (a
    lazy initialisation): a channels_last input pays that copy, once. ``cached=False`` (the
    control) takes them again on every forward: a channels_last-only copy each time."""

    def __init__(self, cached: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.cached = cached
        self.statistics: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.statistics is None or not self.cached:
            self.statistics = x.contiguous().mean((0, 2, 3)).view(1, -1, 1, 1)  # the copy
        return self.conv(x - self.statistics)


class FailsOnce(nn.Module):
    """Raises on its first forward only (a lazy initialisation that fails once): the warm-up
    fails, the audited run then runs; the audit must still fail, saying so."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("not initialised yet")
        return self.conv(x)
