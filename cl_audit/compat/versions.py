"""The installed torch's release, and the one error a missing feature raises."""

from __future__ import annotations

import re

import torch

from cl_audit.errors import UsageError

__all__ = ["TORCH_VERSION", "missing", "torch_version"]


def torch_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``2.15.0+cu132``."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(match[1]), int(match[2])


TORCH_VERSION = torch_version(torch.__version__)


def missing(feature: str, needed_for: str) -> UsageError:
    return UsageError(
        f"torch {torch.__version__} lacks {feature}, which {needed_for} needs; "
        "see docs/torch-versions.md for the releases tested"
    )
