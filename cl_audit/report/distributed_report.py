"""Channels_last under DistributedDataParallel (``cl-audit MODEL --train --ddp``;
``ModelReport.ddp``): for each order of conversion and wrapping, and with
``gradient_as_bucket_view`` off and on, each parameter's strides against DDP's bucket view of
its gradient, the warning DDP printed, and the bytes copied in the step; and the FSDP
pre-flight (``--fsdp``): what FSDP2 refuses, and the layouts FSDP1 hands back."""

from __future__ import annotations

from dataclasses import dataclass

from cl_audit.enums import BucketMatch, WrapOrder

__all__ = [
    "BucketParameter",
    "DdpCheck",
    "DdpRun",
    "FsdpCheck",
    "FsdpRun",
    "ShardedParameter",
    "bucket_match",
]


def bucket_match(
    shape: tuple[int, ...], strides: tuple[int, ...], bucket: tuple[int, ...]
) -> BucketMatch:
    """``strides`` against ``bucket``'s: equal; differing only in size-1 dimensions, where DDP
    compares every stride and autograd's layout contract ignores them (ambiguous); or not."""
    if strides == bucket:
        return BucketMatch.MATCHES
    if all(s == b for n, s, b in zip(shape, strides, bucket, strict=True) if n > 1):
        return BucketMatch.AMBIGUOUS
    return BucketMatch.MISMATCHED


@dataclass(frozen=True)
class BucketParameter:
    """A 4-D or 5-D parameter: its strides in the step, its bucket view's (the parameter's
    strides when DDP was built: ``Reducer`` lays the view out with them), its gradient's after
    the backward, and how the parameter's and the gradient's strides compare with the view's
    (the worse of the two)."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    bucket_strides: tuple[int, ...]
    grad_strides: tuple[int, ...] | None
    match: BucketMatch


@dataclass(frozen=True)
class DdpRun:
    """One training step under DDP: the order of conversion and wrapping, the bucket view
    option, what DDP warned (its first line), the bytes ``aten::copy_`` wrote in the step (the
    profiler, rank 0), and the model's 4-D and 5-D parameters."""

    order: WrapOrder
    bucket_view: bool
    warning: str | None
    copied: int
    parameters: tuple[BucketParameter, ...]

    def count(self, match: BucketMatch) -> int:
        return sum(p.match is match for p in self.parameters)


@dataclass(frozen=True)
class DdpCheck:
    """The step under DDP in every configuration, on a gloo process group of ``world_size``
    real processes on this machine (every rank found the same strides: ``ranks_agree``)."""

    world_size: int
    backend: str
    runs: tuple[DdpRun, ...]
    ranks_agree: bool

    def run(self, order: WrapOrder, bucket_view: bool) -> DdpRun:
        return next(r for r in self.runs if r.order is order and r.bucket_view is bucket_view)

    @property
    def advice(self) -> str | None:
        """What to do, where converting after wrapping mismatches the buckets and converting
        before does not; None where both orders are alike."""
        before = [self.run(WrapOrder.BEFORE, view) for view in (False, True)]
        after = [self.run(WrapOrder.AFTER, view) for view in (False, True)]
        worse = sum(r.count(BucketMatch.MISMATCHED) for r in after) > sum(
            r.count(BucketMatch.MISMATCHED) for r in before
        )
        if not worse:
            return None
        return (
            "convert the model to channels_last before wrapping it in DDP: DDP lays its "
            "gradient buckets out with the strides the parameters have when it is built"
        )


@dataclass(frozen=True)
class ShardedParameter:
    """A 4-D or 5-D parameter under FSDP: its strides before wrapping (channels_last) and as
    FSDP hands it back (FSDP1's unflattened view; null where FSDP2 refused it or it did not
    come back), and whether that keeps the order (``kept``; null where nothing came back)."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    unflattened: tuple[int, ...] | None
    kept: bool | None


@dataclass(frozen=True)
class FsdpRun:
    """One FSDP wrapping of the channels_last model: ``fsdp2`` (``fully_shard``) or ``fsdp1``
    (``FullyShardedDataParallel``, with ``use_orig_params``); ``refused``: the parameters
    FSDP2 refused, each made contiguous in turn until it wrapped, with its first message;
    ``error``: why the wrapping or its step failed."""

    api: str
    use_orig_params: bool | None
    parameters: tuple[ShardedParameter, ...]
    refused: tuple[str, ...] = ()
    message: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class FsdpCheck:
    """The FSDP pre-flight on a gloo process group of ``world_size`` processes (rank 0's)."""

    world_size: int
    backend: str
    runs: tuple[FsdpRun, ...]
