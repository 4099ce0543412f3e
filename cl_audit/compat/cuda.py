"""Whether this machine has CUDA, asked without poisoning fork."""

from __future__ import annotations

import torch

__all__ = ["cuda_present"]


def cuda_present() -> bool:
    """Whether this machine has a CUDA device, asked so that forked workers can still use it.
    ``torch.cuda.is_available()`` asks the CUDA runtime (unless PYTORCH_NVML_BASED_CUDA_CHECK is
    set), after which torch refuses CUDA in every child forked later ("Cannot re-initialize CUDA
    in forked subprocess": every row of an eager CUDA sweep, seen on an H200 with torch 2.11);
    ``device_count`` asks NVML first and does not poison fork when NVML answers."""
    return torch.cuda.device_count() > 0
