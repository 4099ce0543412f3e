"""CUDA's fused attention operators, called as ``F.scaled_dot_product_attention`` calls them."""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["fused_attention"]


def fused_attention(
    efficient: bool,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None,
    log_sumexp: bool,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor | None:
    """The output of CUDA's fused attention kernel, called as ``F.scaled_dot_product_attention``
    calls it: the memory-efficient one or cuDNN's, given the arguments this torch's operator
    takes (read from its schema). None where one is given a mask its operator takes none of
    (torch 2.4's cuDNN operator)."""
    operator = _attention_operator(efficient)
    if operator is None:
        return None
    overload, names = operator
    if bias is not None and "attn_bias" not in names:
        return None
    given = {
        "query": query, "key": key, "value": value, "attn_bias": bias,
        "compute_log_sumexp": log_sumexp, "dropout_p": 0.0, "is_causal": is_causal,
        "return_debug_mask": False, "scale": scale,
    }  # fmt: skip
    return overload(**{k: v for k, v in given.items() if k in names})[0]


@functools.cache
def _attention_operator(efficient: bool) -> tuple[Any, frozenset[str]] | None:
    """The fused attention operator's default overload and its arguments' names, read once."""
    name = "_scaled_dot_product_efficient_attention" if efficient else (
        "_scaled_dot_product_cudnn_attention"
    )  # fmt: skip
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None
    return packet.default, frozenset(a.name for a in packet.default._schema.arguments)
