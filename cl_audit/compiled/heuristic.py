"""cl-audit's reading of Inductor's layout heuristic (``GraphLowering.decide_layout_opt``): the
branch that decided a graph and the convolutions that decided it, each convolution classed as
the heuristic classes it; ``graphs`` checks the reading against torch's own answer on every
graph."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import torch

from cl_audit.compat.inductor import (
    GraphConv,
    layout_optimization_enabled,
    layout_optimization_forced,
)
from cl_audit.enums import ConvClass, LayoutBranch
from cl_audit.report.compiled_report import (
    CompiledConv,
)
from cl_audit.rule.attribution import frames_call_site

__all__ = [
    "NODES_PER_CONVOLUTION",
    "VOTE_WEIGHTS",
    "Reading",
    "compiled_conv",
    "conv_flops",
    "explain",
    "module_path_of",
    "on_off",
]


# The inference vote's weights: the average channels_last time against NCHW that Inductor's
# authors measured per class (< 1 is a speed-up), as in decide_layout_opt (torch 2.4 to 2.15).
VOTE_WEIGHTS = {
    ConvClass.GROUPED: 1.358,
    ConvClass.SMALL: 0.783,
    ConvClass.IN_OUT: 0.725,
    ConvClass.DEFAULT: 0.823,
}


NODES_PER_CONVOLUTION = 300  # Inductor skips graphs with this many nodes per convolution


@dataclass(frozen=True)
class Reading:
    decision: bool
    branch: LayoutBranch
    reason: str
    deciding: set[int]  # indexes into the graph's convolutions


def explain(
    convs: list[CompiledConv],
    counted: list[int],
    flops: list[int],
    nodes: int,
    inference: bool,
    generic: bool,
) -> Reading:
    """The heuristic's branch for a graph, in the order decide_layout_opt tests them;
    ``counted`` indexes the convolutions the heuristic counts, ``flops`` is per convolution."""
    if not layout_optimization_enabled():
        reason = "Inductor's layout_optimization is off"
        return Reading(False, LayoutBranch.CONFIG_OFF, reason, set())
    if layout_optimization_forced():
        reason = "Inductor's force_layout_optimization is on"
        return Reading(True, LayoutBranch.FORCED, reason, set())
    if not counted:
        reason = "no convolution in this graph"
        backward = sum(c.backward for c in convs)
        if backward:
            reason = (
                f"this graph's {backward} convolution_backward node(s) are not convolutions to "
                f"torch {torch.__version__}'s heuristic, so it is lowered without layout "
                "optimisation (pytorch/pytorch#189239)"
            )
        return Reading(False, LayoutBranch.NO_CONVOLUTION, reason, set())
    if not generic and torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available():
        reason = (
            "every convolution runs on the CPU with mkldnn, where Inductor always lays "
            "convolutions out channels_last"
        )
        return Reading(True, LayoutBranch.MKLDNN_CPU, reason, set())
    if nodes >= NODES_PER_CONVOLUTION * len(counted):
        reason = (
            f"only {len(counted)} convolution(s) among {nodes} graph nodes (Inductor skips at "
            f"{NODES_PER_CONVOLUTION} nodes per convolution)"
        )
        return Reading(False, LayoutBranch.FEW_CONVOLUTIONS, reason, set())
    if inference:
        return _vote(convs, counted, flops)
    grouped = [i for i in counted if _grouped(convs[i])]
    if grouped:
        first = convs[grouped[0]]
        reason = (
            f"the grouped convolution at {_where(first)} ({first.in_per_group} input channels "
            f"per group) turns it off for the whole graph{_more(grouped)}"
        )
        return Reading(False, LayoutBranch.GROUPED, reason, set(grouped))
    narrowing = [i for i in counted if _in_out(convs[i])]
    if narrowing:
        first = convs[narrowing[0]]
        kernel = "x".join(map(str, first.kernel))
        reason = (
            f"the convolution at {_where(first)} narrows {first.in_per_group} to "
            f"{first.out_channels} channels with a {kernel} kernel (input >= 2x output, "
            f"kernel > 1){_more(narrowing)}"
        )
        return Reading(False, LayoutBranch.IN_OUT, reason, set(narrowing))
    if all(_small(convs[i]) for i in counted):
        reason = f"all {len(counted)} convolutions have at most 64 input and output channels"
        return Reading(False, LayoutBranch.ALL_SMALL, reason, set(counted))
    reason = "no grouped, narrowing or all-small convolutions veto it in a training graph"
    return Reading(True, LayoutBranch.NO_VETO, reason, set())


def _vote(convs: list[CompiledConv], counted: list[int], flops: list[int]) -> Reading:
    """The inference graph's flop-weighted vote: on when the weighted flops stay within the
    flops; when it is off, the grouped convolutions (the only class weighted above 1) decided."""
    total = sum(flops[i] for i in counted)
    weighted = sum(flops[i] * VOTE_WEIGHTS[convs[i].kind] for i in counted)
    ratio = weighted / total if total else 1.0
    decision = weighted <= total
    reason = (
        f"the flop-weighted vote over {len(counted)} convolutions: channels_last would take "
        f"{ratio:.3f}x the NCHW time (on at <= 1)"
    )
    if decision:
        return Reading(True, LayoutBranch.VOTE, reason, set())
    grouped = sorted((i for i in counted if _grouped(convs[i])), key=lambda i: -flops[i])
    share = sum(flops[i] for i in grouped) / total if total else 0.0
    if grouped:
        largest = convs[grouped[0]]
        reason += (
            f"; {share:.0%} of the flops are in grouped convolutions, the largest at "
            f"{_where(largest)} ({largest.in_per_group} input channels per group)"
        )
    return Reading(False, LayoutBranch.VOTE, reason, set(grouped))


def _grouped(c: CompiledConv) -> bool:
    return c.groups > 1 and c.in_per_group > 1


def _small(c: CompiledConv) -> bool:
    return c.out_channels <= 64 and c.in_per_group <= 64


def _in_out(c: CompiledConv) -> bool:
    return c.out_channels * 2 <= c.in_per_group and bool(c.kernel) and c.kernel[0] > 1


def _class(c: CompiledConv) -> ConvClass:
    if _grouped(c):
        return ConvClass.GROUPED
    if _small(c):
        return ConvClass.SMALL
    if _in_out(c):
        return ConvClass.IN_OUT
    return ConvClass.DEFAULT


def conv_flops(c: GraphConv) -> int:
    """Multiply-adds x 2 of the forward convolution: each output element takes one product
    per input channel of its group and kernel position."""
    return 2 * math.prod(c.output) * math.prod(c.weight[1:])


def compiled_conv(c: GraphConv, share: float) -> CompiledConv:
    """The report's convolution (not yet marked deciding), its class from its shape."""
    path, cls = (None, None) if c.module is None else (module_path_of(c.module[0]), c.module[1])
    conv = CompiledConv(
        call_site=frames_call_site(c.frames),
        module_path=path,
        module_class=cls,
        kind=ConvClass.DEFAULT,
        groups=c.groups,
        in_per_group=c.weight[1],
        out_channels=c.weight[0],
        kernel=c.weight[2:],
        flop_share=share,
        deciding=False,
        backward=c.backward,
    )
    return replace(conv, kind=_class(conv))


_GETATTR = re.compile(r"getattr\(([^()]*), '([^']*)'\)")


_ROOT = re.compile(r"^(?:[LG]\['[^']*'\]|[LG]\.\w+)\.?")


_ITEM = re.compile(r"(?:\._modules)?\[['\"]?([^]'\"]+)['\"]?\]")


def module_path_of(qualified: str) -> str:
    """Dynamo's qualified module name (``L['self'].layer1[0].conv1``, or
    ``getattr(L.model.layer1, '0').conv1``) as a dotted module path (``layer1.0.conv1``; the
    root ``""``)."""
    path = qualified
    while _GETATTR.search(path):
        path = _GETATTR.sub(r"\1.\2", path)
    path = _ITEM.sub(r".\1", _ROOT.sub("", path))
    return path.lstrip(".")


def _where(c: CompiledConv) -> str:
    site = c.call_site or "an unknown line"
    return site if c.module_path is None else f"{site} ({c.module_path or 'the model'})"


def _more(indexes: list[int]) -> str:
    return f", and {len(indexes) - 1} more like it" if len(indexes) > 1 else ""


def on_off(decision: bool) -> str:
    return "on" if decision else "off"
