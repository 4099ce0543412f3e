"""The what-if change of a concatenation that mixes layouts (``compare.whatif``): ``torch.cat``
keeps a memory format only when every operand's strides suggest it (torch's
``suggest_memory_format``), so one NCHW-ordered operand, a ``torch.ones`` mask of one channel,
makes the whole result NCHW. The change gives each such operand its partners' layout at the
call, standing for the edit at the line that made it; ``named`` says which operand that was and
which factory call made it (``makers``: the factories' results seen in the run, by identity)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from cl_audit.compat.storage import suggest_memory_format

__all__ = ["FACTORIES", "named", "operands_channels_last"]

# Factories that make a new tensor from sizes alone (NCHW strides unless told otherwise).
FACTORIES = frozenset(["torch.ones", "torch.zeros", "torch.full", "torch.empty"])


def _formats(tensor: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if tensor.dim() == 4 else torch.channels_last_3d


def _mixed(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[int] | None:
    """The positions of the NCHW-ordered operands of a concatenation of 4-D (or 5-D) tensors
    whose others are channels_last, by torch's own suggestion of each one's format; else None."""
    tensors = args[0] if args else kwargs.get("tensors")
    if not isinstance(tensors, (list, tuple)) or len(tensors) < 2:
        return None
    if not all(isinstance(t, torch.Tensor) and t.dim() in (4, 5) for t in tensors):
        return None
    if len({t.dim() for t in tensors}) != 1:
        return None
    wanted = _formats(tensors[0])
    suggested = [suggest_memory_format(t) for t in tensors]
    nchw = [i for i, fmt in enumerate(suggested) if fmt is torch.contiguous_format]
    return nchw if nchw and len(nchw) < len(tensors) and wanted in suggested else None


def operands_channels_last(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """A concatenation of channels_last maps and NCHW-ordered ones made with every operand
    channels_last (the NCHW ones copied into that order at the call: the edit at their maker
    makes them so to begin with); None where the call is not that pattern."""
    nchw = _mixed(args, kwargs)
    if nchw is None:
        return None
    tensors = list(args[0] if args else kwargs["tensors"])
    for i in nchw:
        t = tensors[i]
        tensors[i] = torch.empty_like(t, memory_format=_formats(t)).copy_(t)
    rest = {k: v for k, v in kwargs.items() if k != "tensors"}
    dim = args[1] if len(args) > 1 else rest.pop("dim", 0)
    return torch.cat(tensors, dim, **rest)


def named(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], makers: Mapping[int, tuple[str, str | None]]
) -> str | None:
    """Which operand of the concatenation is NCHW-ordered and where it was made, when a
    factory seen in the run made it (``makers``)."""
    nchw = _mixed(args, kwargs)
    if nchw is None:
        return None
    tensors = args[0] if args else kwargs["tensors"]
    parts = []
    for i in nchw:
        t = tensors[i]
        shape = "x".join(map(str, t.shape))
        maker = makers.get(id(t))
        made = f", made by {maker[0]} at {maker[1] or '?'}" if maker else ""
        parts.append(f"operand {i} ({shape}, NCHW strides{made})")
    return "; ".join(parts)
