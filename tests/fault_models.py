"""Models that misbehave on purpose, to prove one bad model cannot take a sweep down.

Factories for the CLI: ``tests/fault_models.py:<name>``. Sizes stay small except where the
misbehaviour is the size.
"""

from __future__ import annotations

import ctypes
import gc
import os
import time

import torch
from torch import nn

SHAPE = (3, 128, 128)


class Segfaults(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
        return x


class Sleeps(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(os.environ.get("CL_AUDIT_TEST_SLEEP", "60")))
        return x


class Hogs(nn.Module):
    """Allocates and touches 1.5 GB, then waits for the parent to notice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hog = torch.ones(1536 * 1024 * 1024 // 4)
        time.sleep(10)
        return x + hog[:1].sum()


class SaysFrozen(nn.Module):
    """Fails with the number of objects its process's garbage collector leaves alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"frozen objects: {gc.get_freeze_count()}")


class SaysCollecting(nn.Module):
    """Fails saying whether its process collects garbage automatically."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"collecting: {gc.isenabled()}")


def says_collecting() -> tuple[nn.Module, tuple[int, ...]]:
    return SaysCollecting(), SHAPE


def says_frozen() -> tuple[nn.Module, tuple[int, ...]]:
    return SaysFrozen(), SHAPE


def segfaults() -> tuple[nn.Module, tuple[int, ...]]:
    return Segfaults(), SHAPE


def sleeps() -> tuple[nn.Module, tuple[int, ...]]:
    return Sleeps(), SHAPE


def hogs() -> tuple[nn.Module, tuple[int, ...]]:
    return Hogs(), SHAPE


def fine() -> tuple[nn.Module, tuple[int, ...]]:
    return nn.Conv2d(3, 4, 3), SHAPE
