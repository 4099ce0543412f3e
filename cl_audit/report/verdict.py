"""What channels_last costs a model against NCHW: the gate, the cost sites and the verdict.

A cost site is one place (phase, module, call site, operation) where the two runs of the same
forward or step copied a different number of bytes: channels_last-only bytes where the
channels_last run copied more, saved bytes where NCHW did. The model's share is its
channels_last-only bytes over the bytes its channels_last run wrote.

The gate judges at a reference batch (``Gate.batch``, 32 from the CLI and the API): the bytes
paid once per forward or step (parameter sites; outputs derived from parameters alone, the
parameters' gradients and the optimizer's writes) are kept as they are, the rest is scaled
from the audited batch, so that a verdict does not depend on the batch the audit ran with
(``Cost.at_gate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cl_audit.enums import CostKind, Evidence, GateOn, Phase, RemedyStatus, Verdict
from cl_audit.report.codec import JsonForm

__all__ = [
    "GATE_BATCH", "Cost", "CostGroup", "CostSite", "Gate", "MixedSite", "Producer", "Projection",
    "Remedy", "Trial", "fixed_extra", "group_sites", "project",
]  # fmt: skip

MIB = 1 << 20
GATE_BATCH = 32  # the batch the CLI and the API judge at


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
    written and at least ``bytes``, or (timed) when its losses take ``time_share`` of the step;
    the bytes as projected to ``batch`` (None: as audited, the only way before report 7)."""

    share: float = 0.01
    bytes: int = MIB
    time_share: float = 0.01
    batch: int | None = None
    on: GateOn = GateOn.BYTES  # what exit 1 means: too many bytes, or a slower step
    slowdown: float = 0.05  # the speed verdict's band: within it, no difference

    @classmethod
    def of(
        cls,
        fail_share: float,
        fail_bytes: int,
        gate_batch: int | None,
        on: GateOn = GateOn.BYTES,
        fail_slowdown: float = 5.0,
    ) -> Gate:
        """The gate as users give it: ``fail_share`` in percent of the bytes written,
        ``fail_bytes`` extra bytes, at batch ``gate_batch``; ``on`` bytes or speed, with
        ``fail_slowdown`` percent the speed verdict's band."""
        return cls(
            share=fail_share / 100,
            bytes=fail_bytes,
            batch=gate_batch,
            on=on,
            slowdown=fail_slowdown / 100,
        )

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
class Projection:
    """A cost at another batch: the bytes paid once per forward or step as audited, the bytes
    paid per sample scaled; ``projected`` False where the batch is the audited one."""

    batch: int | None
    extra_bytes: int
    bytes_written: int
    projected: bool

    json_form: ClassVar[JsonForm] = JsonForm(derived=("share",))

    @property
    def share(self) -> float:
        return self.extra_bytes / self.bytes_written if self.bytes_written else 0.0


@dataclass(frozen=True)
class Trial:
    """One change tried at a site in a what-if run: the forward run again in both layouts on
    the same input with the change made at the call site. ``failure``: the operation and line
    that raised; ``max_abs_diff`` against the unchanged channels_last output, within
    ``tolerance``; the site's channels_last-only bytes before and after, and what the change
    added at other sites (``moved_bytes``)."""

    change: str  # what the user would write
    line: str  # the call site it was made at
    applied: int  # calls the change was made at, per run
    failure: str | None
    max_abs_diff: float | None
    tolerance: float | None
    site_bytes_before: int
    site_bytes_after: int | None
    moved_bytes: int | None
    extra_bytes_after: int | None  # the model's channels_last-only bytes with the change

    json_form: ClassVar[JsonForm] = JsonForm(derived=("holds",))

    @property
    def holds(self) -> bool:
        """It ran, kept the output and cut the model's channels_last-only bytes at the site."""
        return (
            self.failure is None
            and self.applied > 0
            and self.max_abs_diff is not None
            and self.tolerance is not None
            and self.max_abs_diff <= self.tolerance
            and self.site_bytes_after is not None
            and self.site_bytes_after < self.site_bytes_before
            and self.moved_bytes is not None
            and self.moved_bytes < self.site_bytes_before - self.site_bytes_after
        )


@dataclass(frozen=True)
class Remedy:
    """A known fix for a pattern, with the upstream issue, PR or source that documents it;
    ``status`` says whether a what-if run proved it on this model (``evidence``: each change
    tried) or why not (``note``)."""

    pattern: str
    advice: str
    reference: str
    status: RemedyStatus = RemedyStatus.LEAD
    evidence: tuple[Trial, ...] = ()
    note: str | None = None  # a lead's reason it was not tried; a refuted one's summary

    json_form: ClassVar[JsonForm] = JsonForm(derived=("verified",))

    @property
    def verified(self) -> bool:
        return self.status is RemedyStatus.VERIFIED


@dataclass(frozen=True)
class CostSite:
    """Bytes copied at one place in each run; ``fix_site`` is the operation that last wrote
    the order of the NCHW data this site converts, when another operation did; ``root_cause``
    where that run of NCHW data began (the loss a finding names), when it is neither."""

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
    root_cause: Producer | None = None
    strides: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # the first call's, in, out

    json_form: ClassVar[JsonForm] = JsonForm(derived=("extra", "saved"))

    @property
    def upstream(self) -> tuple[Producer, ...]:
        """The fix site and the root cause, those there are."""
        return tuple(p for p in (self.fix_site, self.root_cause) if p is not None)

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
class CostGroup:
    """Cost sites one fix addresses (``group_sites``): one operation of one kind and phase at one
    source line, in modules of one class (a repeated block's), converting NCHW data from one
    pattern of fix site and root cause (the same operation at the same line, whatever module
    ran it), with one remedy (its pattern and status). ``sites``: the members' positions in
    ``Cost.sites``, costliest first (the first stands for the rest: its fix site, its remedy
    and the proof); ``extra``: their channels_last-only bytes, ``share`` of the cost's."""

    kind: CostKind
    phase: Phase
    op: str
    module_class: str | None
    call_site: str | None
    sites: tuple[int, ...]
    extra: int
    share: float


def _pattern(producer: Producer | None) -> tuple[str | None, ...] | None:
    """A producer as a pattern: its operation and line and its module's class, not the path."""
    if producer is None:
        return None
    return (producer.python_op, producer.aten_op, producer.module_class, producer.call_site)


def group_sites(sites: tuple[CostSite, ...]) -> tuple[CostGroup, ...]:
    """The sites channels_last pays for (``extra`` bytes), grouped by what fixes them (one
    ``CostGroup`` each), the costliest group first; the terminal, the page and the JSON read
    these groups."""
    total = sum(site.extra for site in sites)
    members: dict[tuple[object, ...], list[int]] = {}
    for position, site in enumerate(sites):
        if site.extra:
            remedy = None if site.remedy is None else (site.remedy.pattern, site.remedy.status)
            key = (site.kind, site.phase, site.op, site.module_class, site.call_site,
                   _pattern(site.fix_site), _pattern(site.root_cause), remedy)  # fmt: skip
            members.setdefault(key, []).append(position)
    groups = []
    for positions in members.values():
        positions.sort(key=lambda p: (-sites[p].extra, p))
        first = sites[positions[0]]
        extra = sum(sites[p].extra for p in positions)
        groups.append(
            CostGroup(
                first.kind,
                first.phase,
                first.op,
                first.module_class,
                first.call_site,
                tuple(positions),
                extra,
                extra / total,
            )
        )
    return tuple(sorted(groups, key=lambda g: (-g.extra, g.sites[0])))


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
    batch: int | None = None  # the audited batch: the first input's first dimension
    fixed_bytes: int = 0  # of extra_bytes, at parameter sites: paid once per forward or step
    fixed_written_bytes: int = 0  # of bytes_written, not growing with the batch
    verify_seconds: float | None = None  # the what-if runs' time; None: none ran
    kernel_copy_table: str | None = None  # predicted: the measured kernel copies it read

    json_form: ClassVar[JsonForm] = JsonForm(
        derived=(
            "net_bytes",
            "share",
            "per_sample_bytes",
            "per_sample_written_bytes",
            "at_gate",
            "groups",
        )
    )

    @property
    def groups(self) -> tuple[CostGroup, ...]:
        """The cost sites grouped by what fixes them (``group_sites``)."""
        return group_sites(self.sites)

    @property
    def net_bytes(self) -> int:
        return self.extra_bytes - self.saved_bytes

    @property
    def share(self) -> float:
        return self.extra_bytes / self.bytes_written if self.bytes_written else 0.0

    @property
    def per_sample_bytes(self) -> float | None:
        """Channels_last-only bytes that grow with the batch, per sample."""
        return _per_sample(self.extra_bytes - self.fixed_bytes, self.batch)

    @property
    def per_sample_written_bytes(self) -> float | None:
        return _per_sample(self.bytes_written - self.fixed_written_bytes, self.batch)

    @property
    def at_gate(self) -> Projection:
        """The cost at the gate's batch, which the verdict judges."""
        return self.at(self.gate.batch)

    def at(self, batch: int | None) -> Projection:
        """The cost at ``batch``."""
        return project(self.extra_bytes, self.fixed_bytes, self, batch)

    def judged(self, sites: tuple[CostSite, ...], time_share: float | None = None) -> Verdict:
        """The gate's verdict on ``sites`` (of this cost) alone, at its batch."""
        at = project(sum(s.extra for s in sites), fixed_extra(sites), self, self.gate.batch)
        return self.gate.verdict(at.extra_bytes, at.bytes_written, time_share)


def fixed_extra(sites: tuple[CostSite, ...]) -> int:
    """The channels_last-only bytes of ``sites`` paid once per forward or step: parameter
    sites'."""
    return sum(s.extra for s in sites if s.kind is CostKind.PARAMETER)


def project(extra: int, fixed: int, run: Cost, batch: int | None) -> Projection:
    """``extra`` channels_last-only bytes, ``fixed`` of them paid once per forward or step,
    of ``run``'s audit at ``batch``: the fixed bytes (and bytes written) kept, the rest scaled
    from the audited batch."""
    audited = run.batch
    if batch is None or audited is None or batch == audited:
        return Projection(audited, extra, run.bytes_written, projected=False)
    scale = batch / audited
    written = run.fixed_written_bytes
    return Projection(
        batch,
        fixed + round((extra - fixed) * scale),
        written + round((run.bytes_written - written) * scale),
        projected=True,
    )


def _per_sample(size: int, batch: int | None) -> float | None:
    return None if not batch else size / batch
