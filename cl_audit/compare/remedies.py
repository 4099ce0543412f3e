"""Known remedies, keyed by operation and pattern, each with the source that documents it.

A site gets a remedy when its own operation, or the operation that produced the NCHW-ordered
data it converts (its fix site), matches an entry, on the device the entry holds for, and
channels_last costs bytes there (a site where it saves gets none). An entry that names a
``together`` matches only where the same module has a costing site of that kind in each of its
groups of operations (weight standardisation: the weight's reshape and the convolution that
converts it back). Nothing else is guessed: an unknown pattern has no remedy, and the reports
say so.

An entry may name the changes (``compare.whatif``) that carry its advice out at run time; the
verification phase tries them on the model and the remedy a site shows is the change that held
(``phases.verify``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cl_audit.compat.versions import TORCH_VERSION, torch_version
from cl_audit.enums import CostKind
from cl_audit.intercept.ledger import Shapes
from cl_audit.report.verdict import Remedy

__all__ = [
    "KEEP_AS_IT_WAS",
    "KEPT_PATTERNS",
    "REMEDIES",
    "Match",
    "SiteContext",
    "matches",
    "remedy_for",
    "site_contexts",
]

# The change of the conversion, not of a line: a restrided tensor kept as it was (phases.verify)
KEEP_AS_IT_WAS = "keep_as_it_was"


@dataclass(frozen=True)
class _Entry:
    ops: frozenset[str]  # Python-level names, autograd node names or aten names
    kinds: frozenset[CostKind]
    remedy: Remedy
    prefix: bool = False  # ops are name prefixes (autograd nodes: ``MeanBackward0``, ``1``)
    devices: frozenset[str] = frozenset({"cpu", "cuda"})  # torch device types
    together: tuple[frozenset[str], ...] = ()  # op groups the module must each cost at
    changes: tuple[str, ...] = ()  # what-if changes that carry the advice out (whatif.CHANGES)
    releases: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (99, 0))  # [since, before)
    fits: Callable[[Shapes], bool] | None = None  # the call's shapes its pattern matches


def _entry(
    ops: str,
    kinds: str,
    pattern: str,
    advice: str,
    reference: str,
    prefix: bool = False,
    devices: str = "cpu cuda",
    together: tuple[str, ...] = (),
    changes: str = "",
    releases: str = "",
    fits: Callable[[Shapes], bool] | None = None,
) -> _Entry:
    """An entry; ``releases`` ("2.4-2.15": from 2.4 on, before 2.15) bounds the torch releases
    whose kernels its advice describes (none: every release); ``fits`` the copying calls its
    pattern describes, by the shape copied and the shape returned (none: every call)."""
    since, _, before = releases.partition("-")
    return _Entry(
        frozenset(ops.split()),
        frozenset(CostKind(k) for k in kinds.split()),
        Remedy(pattern, advice, reference),
        prefix,
        frozenset(devices.split()),
        tuple(frozenset(group.split()) for group in together),
        tuple(changes.split()),
        (torch_version(since or "0.0"), torch_version(before or "99.0")),
        fits,
    )


@dataclass(frozen=True)
class SiteContext:
    """What an entry may ask of a site beyond its operation: the device of the run, per cost
    kind the operations costing channels_last bytes in the site's module, the torch release."""

    device: str
    module_ops: frozenset[tuple[CostKind, str]] = frozenset()
    release: tuple[int, int] = TORCH_VERSION  # the torch the audit runs


_KEEP_ADVICE = (
    "keep it as it was: convert only the convolution weights "
    "(torch.nn.utils.convert_conv2d_weight_memory_format(model, torch.channels_last), the input "
    "still channels_last), or give it back its strides after "
    "model.to(memory_format=torch.channels_last): p.data = p.data.contiguous()"
)


def _batch_and_channels_merged(shapes: Shapes) -> bool:
    """A reshape of (b, c, h, w) to (b * c, ..., h, w): each channel as a batch item."""
    copied, returned = shapes
    return (
        len(copied) == 4 and len(returned) >= 3
        and returned[0] == copied[0] * copied[1] and returned[-2:] == copied[-2:]
    )  # fmt: skip


def _not_per_channel(shapes: Shapes) -> bool:
    """Any other reshape: to features or tokens, a patch or window partition."""
    return not _batch_and_channels_merged(shapes)


# Weight standardisation: the weight's reshape or normalisation, and the convolution of it.
_STANDARDISE = "torch.batch_norm Tensor.reshape torch.reshape Tensor.view"
_CONVOLVE = "torch.conv2d aten.convolution"

REMEDIES: tuple[_Entry, ...] = (
    _entry(
        "torch.flatten Tensor.flatten torch.reshape Tensor.reshape Tensor.view",
        "copy",
        "flatten or reshape of a channels_last map",
        "reshape in memory order: for NHWC data x.permute(0, 2, 3, 1).flatten(1, 2) gives "
        "(B, H*W, C) tokens as a view; a patch or window partition copies in either layout; "
        "before a classifier pool first, or flatten(1) the permuted map (it reorders "
        "features: only for new or adapted weights)",
        "strides: a view needs the dimensions it merges to be adjacent in memory, so NHWC "
        "data reshaped to C*H*W order must copy (torch.Tensor.view)",
        fits=_not_per_channel,
    ),
    _entry(
        "Tensor.reshape torch.reshape Tensor.view",
        "copy",
        "batch and channels of a channels_last map merged, x.reshape(b * c, 1, h, w), to "
        "filter each channel with one kernel",
        "a grouped convolution of the map with the kernel repeated per channel, "
        "F.conv2d(x, kernel.repeat(c, 1, 1, 1), groups=c), then .view(b, c, k, h, w)",
        "strides: merging b and c is a view only where c is the outer of the two in memory "
        "(NCHW); a grouped convolution reads each channel in place (torch.nn.functional.conv2d, "
        "groups)",
        changes="depthwise",
        fits=_batch_and_channels_merged,
    ),
    _entry(
        "Tensor.contiguous",
        "copy",
        "permute(...).contiguous() or .contiguous() writing NCHW order",
        "drop the .contiguous() (timm's LayerNorm2d permutes, normalises and permutes back "
        "with no copy), or write .contiguous(memory_format=torch.channels_last) for 4D data",
        "timm/layers/norm.py LayerNorm2d",
        changes="drop channels_last",
    ),
    _entry(
        "Tensor.contiguous",
        "copy",
        "a channel shuffle (view, transpose, .contiguous(), view) of channels_last maps",
        "F.channel_shuffle(x, groups) (nn.ChannelShuffle) writes the shuffle in the input's "
        "memory format on the CPU",
        "aten/src/ATen/native/ChanelShuffle.cpp: channel_shuffle_cpu keeps "
        "suggest_memory_format(); CUDA runs math_channel_shuffle, which writes NCHW",
        devices="cpu",
        changes="channel_shuffle",
    ),
    _entry(
        f"{_STANDARDISE} {_CONVOLVE}",
        "parameter",
        "a channels_last weight reshaped or standardised every forward (weight "
        "standardisation) and converted back by the convolution",
        "standardise in NHWC order (the per-output-channel statistics over the permuted "
        "weight, no reshape to (1, out, -1)); keeping these weights NCHW leaves one of the "
        "two copies",
        "timm/layers/std_conv.py",
        together=(_STANDARDISE, _CONVOLVE),
        changes="rows_in_memory_order",
    ),
    _entry(
        "Tensor. torch. F. aten.",
        "parameter",
        "a parameter or buffer that the model's conversion restrided to channels_last, "
        "converted back by an operation every forward (a position table reshaped to tokens)",
        _KEEP_ADVICE,
        "Module.to(memory_format=...) restrides every 4-D parameter and buffer; "
        "torch.nn.utils.convert_conv2d_weight_memory_format converts convolution weights only",
        prefix=True,
        changes=KEEP_AS_IT_WAS,
    ),
    _entry(
        "torch::autograd::AccumulateGrad",
        "copy",
        "a gradient copied into the layout of its parameter, which the model's conversion "
        "restrided to channels_last (the gradient comes back in NCHW order)",
        _KEEP_ADVICE,
        "AccumulateGrad lays a gradient out as its parameter "
        "(torch/csrc/autograd/functions/accumulate_grad.h); Module.to(memory_format=...) "
        "restrides every 4-D parameter",
        changes=KEEP_AS_IT_WAS,
    ),
    _entry(
        "Tensor.new_full Tensor.new_zeros Tensor.new_empty torch.full torch.zeros torch.empty",
        "copy",
        "a new 4-D or 5-D tensor allocated in NCHW order, then filled (a batch of images "
        "padded to one size)",
        "allocate it channels_last (torch.empty(..., memory_format=torch.channels_last)); "
        "the data copied into it keeps that order",
        "torch.empty's memory_format argument (torch docs, tensor creation ops)",
        changes="allocate_channels_last",
    ),
    _entry(
        "F.instance_norm torch.instance_norm",
        "copy kernel",
        "an instance norm of a channels_last map (torch normalises it as a batch norm of a "
        "(1, N*C, H, W) reshape, in NCHW order)",
        "nn.GroupNorm(C, C) (F.group_norm(x, C, weight, bias, eps)): one group per channel "
        "normalises the same values, in the input's layout (without running statistics)",
        "torch/nn/functional.py instance_norm and aten/src/ATen/native/Normalization.cpp "
        "instance_norm (the reshape); group_norm keeps channels_last on the CPU (measured, "
        "torch 2.14.1); CUDA's GroupNorm copies up to torch 2.14",
        devices="cpu",
        changes="group_norm",
    ),
    _entry(
        "torch.cat torch.concat torch.concatenate",
        "copy kernel",
        "a concatenation of channels_last maps with an NCHW-ordered one (a mask made by "
        "torch.ones): torch.cat keeps a memory format only when every operand suggests it",
        "make every operand in the same layout: create the NCHW one in its partners' "
        "(torch.ones_like(x[:, :1]) for a mask of x's, or torch.empty(size, "
        "memory_format=torch.channels_last).fill_(value))",
        "aten/src/ATen/native/TensorShape.cpp cat_compute_output_memory_format (the format "
        "every input suggests, else contiguous); measured: torch 2.14.1 on the CPU",
        changes="operands_channels_last",
    ),
    _entry(
        "Tensor.softmax torch.softmax F.softmax Tensor.log_softmax torch.log_softmax F.log_softmax",
        "copy kernel",
        "a softmax over the channels of a channels_last map (its kernel writes NCHW order)",
        "take it over the last dimension of the channels-last view, x.permute(0, 2, 3, "
        "1).softmax(-1).permute(0, 3, 1, 2): the same values, a view in and out",
        "strides: in channels_last the channels are the innermost dimension, the one a "
        "softmax kernel reads contiguously; measured: softmax(dim=1) of channels_last input "
        "returns NCHW on the CPU, torch 2.14.1",
        changes="softmax_last_dim log_softmax_last_dim",
    ),
    _entry(
        "MeanBackward",
        "copy kernel",
        "the mean's backward (a global pool by mean((2, 3))) expands an NCHW gradient",
        "pool with F.adaptive_avg_pool2d(x, 1) or avg_pool2d(x, x.shape[-2:]): their "
        "backward keeps the gradient channels_last",
        "autograd mean_backward (torch/csrc/autograd/FunctionsManual.cpp), measured on "
        "cpu and meta, torch 2.14.1",
        prefix=True,
    ),
    _entry(
        "ConvolutionBackward",
        "kernel",
        "the CPU convolution backward copies inside (with a channels_last weight it writes its "
        "weight gradient in another order, then converts it)",
        "no model-side fix: a kernel matter; when this cost matters, train on the CPU in NCHW",
        "measured with the profiler (scripts/ground_truth.py), torch 2.14.1 on the CPU: "
        "reports/pages/ground-truth.md",
        prefix=True,
        devices="cpu",
    ),
    _entry(
        "SliceBackward",
        "copy kernel",
        "slice_backward allocates a contiguous gradient for a channels_last slice",
        "avoid slicing channels in hot paths (torch.split or chunk of the channel dim "
        "has the same backward); report it upstream",
        "autograd slice_backward (torch/csrc/autograd/FunctionsManual.cpp)",
        prefix=True,
    ),
    _entry(
        "aten.native_group_norm aten.native_group_norm_backward torch.group_norm",
        "kernel copy",
        "GroupNorm on CUDA makes its input contiguous (torch up to 2.14)",
        "keep the GroupNorm blocks NCHW on CUDA, or use torch 2.15, whose GroupNorm kernels "
        "keep channels_last",
        "aten/src/ATen/native/group_norm.cpp; pytorch#111824; PR 191945",
        devices="cuda",
        releases="-2.15",
    ),
    _entry(
        "aten.native_group_norm aten.native_group_norm_backward torch.group_norm",
        "kernel copy",
        "GroupNorm on CUDA counted as a copy by kernels measured on an earlier torch",
        "this torch's GroupNorm kernels keep channels_last on CUDA (PR 191945) by their "
        "source, not measured here: the copy comes from the kernel copies of an earlier "
        "release; time the step on a GPU (--time) before changing the model",
        "aten/src/ATen/native/group_norm.cpp; PR 191945",
        devices="cuda",
        releases="2.15-",
    ),
    _entry(
        "aten.reflection_pad2d aten.replication_pad2d",
        "kernel copy",
        "reflect or replicate F.pad on CUDA returns contiguous",
        "no layout-keeping equivalent on CUDA (padding_mode='reflect' in the convolution calls "
        "F.pad too); a zero pad keeps channels_last but changes the model's numbers: only for "
        "new or retrained weights",
        "channels_last padding kernels are CPU-only: PR 99608 (CPU kernels), PR 179366 (meta "
        "keeps channels_last for CPU only); pytorch#96738",
        devices="cuda",
    ),
)


# The patterns whose remedy is to keep a restrided tensor as it was (``KEEP_AS_IT_WAS``).
KEPT_PATTERNS = frozenset(e.remedy.pattern for e in REMEDIES if KEEP_AS_IT_WAS in e.changes)


def _matches(
    entry: _Entry, op: str | None, kind: CostKind, context: SiteContext, shapes: Shapes | None
) -> bool:
    if op is None or kind not in entry.kinds or context.device not in entry.devices:
        return False
    if entry.fits is not None and shapes is not None and not entry.fits(shapes):
        return False
    since, before = entry.releases
    if not since <= context.release < before:
        return False
    named = any(op.startswith(p) for p in entry.ops) if entry.prefix else op in entry.ops
    return named and all(
        any((kind, o) in context.module_ops for o in group) for group in entry.together
    )


@dataclass(frozen=True)
class Match:
    """A catalogue entry that matches a site: by the site's own operation, or (``at_fix``) by
    its fix site's."""

    remedy: Remedy
    changes: tuple[str, ...]
    at_fix: bool


def matches(
    kind: CostKind,
    ops: tuple[str | None, ...],
    fix_ops: tuple[str | None, ...],
    context: SiteContext,
    shapes: tuple[Shapes | None, Shapes | None] = (None, None),
) -> tuple[Match, ...]:
    """The entries for a costing site of ``kind`` whose operation goes by ``ops`` (Python name,
    aten name), then those for its fix site, whose operation goes by ``fix_ops`` (a copy, or
    for a parameter site a parameter conversion); the catalogue's order within each. ``shapes``:
    the site's call's and the fix site's (``Ledger.copy_shapes``), where known: an entry whose
    pattern does not fit them is left out."""
    fix_kind = CostKind.PARAMETER if kind is CostKind.PARAMETER else CostKind.COPY
    own = [
        Match(e.remedy, e.changes, False)
        for e in REMEDIES
        if any(_matches(e, op, kind, context, shapes[0]) for op in ops)
    ]
    fix = [
        Match(e.remedy, e.changes, True)
        for e in REMEDIES
        if any(_matches(e, op, fix_kind, context, shapes[1]) for op in fix_ops)
    ]
    return (*own, *fix)


def remedy_for(
    kind: CostKind,
    ops: tuple[str | None, ...],
    fix_ops: tuple[str | None, ...],
    context: SiteContext,
    shapes: tuple[Shapes | None, Shapes | None] = (None, None),
) -> Remedy | None:
    """The catalogue's first remedy for the site (``matches``), untried."""
    found = matches(kind, ops, fix_ops, context, shapes)
    return found[0].remedy if found else None


def site_contexts(
    sites: Iterable[tuple[str | None, CostKind, tuple[str | None, ...]]], device: str
) -> dict[str | None, SiteContext]:
    """Each module's context from its costing sites, given as (module path, kind, operation
    names)."""
    costing: dict[str | None, set[tuple[CostKind, str]]] = {}
    for module, kind, ops in sites:
        costing.setdefault(module, set()).update((kind, op) for op in ops if op is not None)
    return {module: SiteContext(device, frozenset(ops)) for module, ops in costing.items()}
