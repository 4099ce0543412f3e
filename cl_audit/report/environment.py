"""Names of dtypes and autocast states, and the versions a report records."""

from __future__ import annotations

import platform
from importlib import metadata

import torch

from cl_audit.enums import Engine, TensorMode
from cl_audit.report import Environment

__all__ = ["autocast_in_effect", "autocast_name", "distribution_version", "dtype_name", "probe"]


def distribution_version(name: str) -> str | None:
    """Installed version without importing the package (importing timm costs seconds)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def autocast_name(device_type: str, dtype: torch.dtype) -> str:
    """As reports write an autocast state: ``cpu:bfloat16``."""
    return f"{device_type}:{dtype_name(dtype)}"


def autocast_in_effect() -> str | None:
    """The autocast state of the calling thread, named as ``autocast_name`` does."""
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return autocast_name(device_type, torch.get_autocast_dtype(device_type))
    return None


def probe(
    *,
    device: str | None,
    dtype: str | None,
    autocast: str | None,
    engine: Engine,
    mode: TensorMode,
    train: bool = False,
    optimizer: str | None = None,
) -> Environment:
    """Versions of the tool and its libraries, with the settings of an audit."""
    return Environment(
        tool=distribution_version("cl-audit") or "unknown",
        python=platform.python_version(),
        torch=torch.__version__,
        torchvision=distribution_version("torchvision"),
        timm=distribution_version("timm"),
        device=device,
        dtype=dtype,
        autocast=autocast,
        engine=engine,
        mode=mode,
        train=train,
        optimizer=optimizer,
    )
