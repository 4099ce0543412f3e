"""FSDP's entry points, which moved between releases: reached here only, behind a probe."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["fully_shard"]

# FSDP2's fully_shard: torch.distributed.fsdp from 2.6, torch.distributed._composable.fsdp before
_FULLY_SHARD = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def fully_shard() -> tuple[Callable[..., Any] | None, str | None]:
    """FSDP2's ``fully_shard``, or None and why this torch lacks it."""
    for module in _FULLY_SHARD:
        try:
            found = getattr(importlib.import_module(module), "fully_shard", None)
        except ImportError:
            continue
        if found is not None:
            return found, None
    return None, f"torch {torch.__version__} has no FSDP2 fully_shard"
