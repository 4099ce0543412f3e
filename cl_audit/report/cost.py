"""What channels_last costs a model against NCHW: the gate, the cost sites and the verdict.

A cost site is one place (phase, module, call site, operation) where the two runs of the same
forward or step copied a different number of bytes: channels_last-only bytes where the
channels_last run copied more, saved bytes where NCHW did. The model's share is its
channels_last-only bytes over the bytes its channels_last run wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cl_audit.enums import CostKind, Evidence, Phase, Verdict
from cl_audit.report.codec import JsonForm

__all__ = ["Cost", "CostSite", "Gate", "MixedSite", "Producer", "Remedy"]

MIB = 1 << 20


@dataclass(frozen=True)
class Producer:
    """The operation that produced a contiguous tensor which later met channels_last data (a
    finding's root cause, a cost site's fix site)."""

    python_op: str | None
    aten_op: str | None
    module_path: str | None
    module_class: str | None
    call_site: str | None


@dataclass(frozen=True)
class Gate:
    """A model offends when its channels_last-only bytes are at least ``share`` of the bytes
    written and at least ``bytes``, or (timed) when its losses take ``time_share`` of the step."""

    share: float = 0.01
    bytes: int = MIB
    time_share: float = 0.01

    def verdict(self, extra: int, written: int, time_share: float | None = None) -> Verdict:
        if extra <= 0:
            return Verdict.CLEAN
        share = extra / written if written else 1.0
        if extra >= self.bytes and share >= self.share:
            return Verdict.OFFENDING
        if time_share is not None and time_share >= self.time_share:
            return Verdict.OFFENDING
        return Verdict.MINOR


@dataclass(frozen=True)
class Remedy:
    """A known fix for a pattern, with the upstream issue, PR or source that documents it."""

    pattern: str
    advice: str
    reference: str


@dataclass(frozen=True)
class CostSite:
    """Bytes copied at one place in each run; ``fix_site`` is the operation that produced the
    NCHW-ordered data this site converts, when another operation did."""

    kind: CostKind
    phase: Phase
    op: str
    aten_op: str | None
    module_path: str | None
    module_class: str | None
    call_site: str | None
    channels_last_bytes: int
    nchw_bytes: int
    channels_last_count: int
    nchw_count: int
    fix_site: Producer | None = None
    remedy: Remedy | None = None

    json_form: ClassVar[JsonForm] = JsonForm(derived=("extra", "saved"))

    @property
    def extra(self) -> int:
        """Bytes only channels_last copies here."""
        return max(0, self.channels_last_bytes - self.nchw_bytes)

    @property
    def saved(self) -> int:
        """Bytes NCHW copies here that channels_last does not."""
        return max(0, self.nchw_bytes - self.channels_last_bytes)

    @property
    def where(self) -> str:
        """The call site, or why there is none: copies the profiler measured inside an
        operation the ledger had not placed, or an operation with no frame outside torch."""
        if self.call_site is not None:
            return self.call_site
        if self.module_path is None:
            return f"unlocated: measured inside {self.aten_op or self.op}, not placed"
        return "no call site: no frame outside torch"


@dataclass(frozen=True)
class MixedSite:
    """An elementwise operation that read channels_last and NCHW inputs together: no copy,
    strided reads of ``bytes_read`` (the inputs in the other order), counted apart."""

    op: str
    phase: Phase
    module_path: str | None
    call_site: str | None
    count: int
    bytes_read: int


@dataclass(frozen=True)
class Cost:
    """The comparison of a channels_last run with the same forward or step in NCHW."""

    gate: Gate
    verdict: Verdict
    bytes_written: int  # by every operation of the channels_last run (new or in-place outputs)
    extra_bytes: int
    saved_bytes: int
    kernel_copies: Evidence  # how the conversions inside kernels were counted
    sites: tuple[CostSite, ...]  # most channels_last-only bytes first
    mixed: tuple[MixedSite, ...] = ()
    unlocated_bytes: int = 0  # measured kernel copies where no conversion was predicted

    json_form: ClassVar[JsonForm] = JsonForm(derived=("net_bytes", "share"))

    @property
    def net_bytes(self) -> int:
        return self.extra_bytes - self.saved_bytes

    @property
    def share(self) -> float:
        return self.extra_bytes / self.bytes_written if self.bytes_written else 0.0
