"""The speed section of a report: does channels_last pay? The step's time in both layouts,
measured (``--time`` on an eager run: both layouts timed in alternating rounds, then each
profiled once) or predicted (an operation time table applied to the two runs' operations), the
time per operation class in each, and the verdict within the gate's band."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import ClassVar

from cl_audit.enums import GateOn, SpeedBasis, SpeedClass, SpeedVerdict, Verdict
from cl_audit.report.codec import JsonForm
from cl_audit.report.compiled_speed import CompiledSpeed, ratio_text
from cl_audit.report.machine import TableUse
from cl_audit.report.stages import StageTime
from cl_audit.report.verdict import Cost

__all__ = [
    "ClassTime", "LayoutTime", "Speed", "SpeedRow", "offends", "round_ratios", "speed_verdict",
    "undecided",
]  # fmt: skip


def offends(verdict: Verdict | None, cost: Cost | None, speed: Speed | None) -> bool:
    """What exit 1 means for one model: with the gate on speed (``cost.gate.on``),
    channels_last's step slower than NCHW's beyond the band; else the byte verdict offending."""
    if cost is not None and cost.gate.on is GateOn.SPEED:
        return speed is not None and speed.gated is SpeedVerdict.SLOWER
    return verdict is Verdict.OFFENDING


def undecided(on: GateOn, speed: Speed | None) -> str | None:
    """Why a gate ``on`` speed cannot decide (the speed unknown, and why: the compiled step's,
    where the run compiled); None where it can, or where the gate is on bytes. The command
    exits 2 then, never by the byte verdict."""
    if on is not GateOn.SPEED:
        return None
    if speed is None:
        return "the run has no speed section"
    if speed.compiled is not None and not speed.compiled.known:
        return f"the compiled speed is unknown: {speed.compiled.note}"
    if speed.verdict is SpeedVerdict.UNKNOWN:
        return speed.note or "the speed is unknown"
    return None


def speed_verdict(
    speedup: float | None, low: float | None, high: float | None, band: float
) -> SpeedVerdict:
    """The verdict on ``speedup`` (NCHW's time over channels_last's: > 1, channels_last is
    faster), within ``band`` of even (0.05: 0.95-1.05 is no difference). Measured, with the
    round-by-round ratios' quartiles ``low`` and ``high``: faster or slower only when the middle
    half of the rounds lies on that side of even, no difference only when it lies within the
    band, else inconclusive. Predicted (no quartiles): by the speedup alone."""
    if speedup is None:
        return SpeedVerdict.UNKNOWN
    if low is None or high is None:
        low = high = speedup
    if speedup >= 1 + band and low > 1:
        return SpeedVerdict.FASTER
    if speedup <= 1 - band and high < 1:
        return SpeedVerdict.SLOWER
    if 1 - band <= low and high <= 1 + band:
        return SpeedVerdict.NO_DIFFERENCE
    return SpeedVerdict.INCONCLUSIVE


@dataclass(frozen=True)
class ClassTime:
    """One operation class's milliseconds per step in each layout."""

    speed_class: SpeedClass
    channels_last_ms: float
    nchw_ms: float

    json_form: ClassVar[JsonForm] = JsonForm(keys={"speed_class": "class"}, derived=("speedup",))

    @property
    def speedup(self) -> float | None:
        return self.nchw_ms / self.channels_last_ms if self.channels_last_ms > 0 else None


SHOWN_MS = 0.005  # under this a time prints as 0.00 ms: no ratio is shown of it


@dataclass(frozen=True)
class SpeedRow:
    """One row of the time table as printed: its milliseconds in each layout, and the ratio
    (None where either time prints as zero: "-", never 0.00x or a ratio of rounding). The
    step's row (``total``) carries the verdict's own speedup (measured: the median round's
    ratio, not the ratio of the median steps), so the table and the headline agree."""

    label: str
    channels_last_ms: float
    nchw_ms: float
    total: bool = False
    stated: float | None = None  # the step's speedup as the verdict has it

    @property
    def speedup(self) -> float | None:
        if self.total:
            return self.stated
        if min(self.channels_last_ms, self.nchw_ms) < SHOWN_MS:
            return None
        return self.nchw_ms / self.channels_last_ms


@dataclass(frozen=True)
class LayoutTime:
    """One layout's step: its milliseconds; its kernels' and the host's (predicted: the model's
    two parts; measured: the profiler's operations' own time, and None); its operations; and
    measured, each round's milliseconds per step."""

    ms: float
    device_ms: float | None = None
    host_ms: float | None = None
    operations: int | None = None
    rounds_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class Speed:
    """Whether channels_last pays against NCHW (see the module docstring).

    ``speedup`` is NCHW's step over channels_last's (measured: the median round's ratio, with
    the quartiles ``low`` and ``high``); ``band`` the gate's no-difference band. ``classes``
    splits each step by operation class; ``conversion_share`` is the conversions' share of the
    channels_last step; ``sites_ms`` the time of the cost sites' operations in that step, and
    ``fixed_speedup`` the speedup with it gone (what fixing the sites would gain). ``table``
    is the operation time table a prediction used: whose machine it describes and how that
    matched this one (report version 14; older reports named it alone); ``stand_ins`` the
    operations it had no samples of (priced as an elementwise addition). ``note`` says what is
    missing, and why. ``stages`` (report version 15, with the timeline: the page's picture)
    splits each step by the model's stages (``report.stages``): predicted, what each stage's
    operations add to the step; measured, its operations' own time in the profiled step.
    ``compiled`` (report version 16, with ``compile``) is the same question under
    ``torch.compile`` (``report.compiled_speed``); the speed gate reads it where it is there."""

    basis: SpeedBasis | None
    verdict: SpeedVerdict
    band: float
    device: str
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    channels_last: LayoutTime | None = None
    nchw: LayoutTime | None = None
    classes: tuple[ClassTime, ...] = ()
    conversion_share: float | None = None
    sites_ms: float | None = None
    fixed_speedup: float | None = None
    table: TableUse | None = None
    stand_ins: tuple[str, ...] = ()
    settings: tuple[tuple[str, str], ...] = ()  # how it was measured or predicted
    note: str | None = None
    stages: tuple[StageTime, ...] = ()
    compiled: CompiledSpeed | None = None

    json_form: ClassVar[JsonForm] = JsonForm(derived=("known",))

    @property
    def known(self) -> bool:
        return self.verdict is not SpeedVerdict.UNKNOWN

    @property
    def gated(self) -> SpeedVerdict:
        """The verdict the speed gate reads: the compiled step's where the run compiled."""
        return self.verdict if self.compiled is None else self.compiled.verdict

    @property
    def fixes_matter(self) -> bool:
        """Whether the cost sites take at least 1% of the channels_last step."""
        cl = self.channels_last
        return bool(
            self.fixed_speedup is not None
            and self.sites_ms
            and cl
            and self.sites_ms >= 0.01 * cl.ms
        )

    def rows(self) -> tuple[SpeedRow, ...]:
        """The classes, then what of the step they leave out (predicted: the host's time not
        hidden under the kernels; measured: the timed step beyond the profiled classes), then
        the step: so the rows add up to the step wherever it is printed."""
        rows = [SpeedRow(c.speed_class.value, c.channels_last_ms, c.nchw_ms) for c in self.classes]
        cl, nchw = self.channels_last, self.nchw
        if cl is None or nchw is None:
            return tuple(rows)
        left = (cl.ms - sum(r.channels_last_ms for r in rows),
                nchw.ms - sum(r.nchw_ms for r in rows))  # fmt: skip
        if rows and max(abs(x) for x in left) >= SHOWN_MS:
            label = ("host, not overlapped" if self.basis is SpeedBasis.PREDICTED
                     else "outside the classes")  # fmt: skip
            rows.append(SpeedRow(label, *left))
        return (*rows, SpeedRow("step", cl.ms, nchw.ms, total=True, stated=self.speedup))

    def headline(self) -> str:
        """``channels_last 1.32x faster (measured, rounds 1.28-1.35x); fixing the sites: about
        1.36x``, or ``... (predicted with this machine's table)``; where the run compiled,
        both verdicts: ``eager: 0.97x, slower (measured, ...); compiled: 1.05x, faster
        (measured, ...)``."""
        if self.compiled is not None:
            return f"eager: {self._eager()}; {self.compiled.headline()}"
        if not self.known or self.speedup is None:
            return f"speed unknown: {self.note}" if self.note else "speed unknown"
        basis = self._basis()
        if self.verdict is SpeedVerdict.INCONCLUSIVE:
            text = (
                f"channels_last inconclusive against NCHW ({self.speedup:.2f}x, rounds "
                f"{self.low:.2f}-{self.high:.2f}x; {basis})"
            )
        elif self.verdict is SpeedVerdict.NO_DIFFERENCE:
            text = f"channels_last no different from NCHW ({self.speedup:.2f}x; {basis})"
        else:
            factor = self.speedup if self.speedup >= 1 else 1 / self.speedup
            text = f"channels_last {factor:.2f}x {self.verdict.value} ({basis})"
        if self.fixes_matter:
            text += f"; fixing the sites: about {self.fixed_speedup:.2f}x"
        return text

    def _eager(self) -> str:
        if not self.known or self.speedup is None:
            return f"unknown ({self.note})" if self.note else "unknown"
        return ratio_text(self.speedup, self.verdict, self._basis())

    def _basis(self) -> str:
        if self.basis is SpeedBasis.MEASURED:
            spread = self.low is not None and self.high is not None
            return f"measured, rounds {self.low:.2f}-{self.high:.2f}x" if spread else "measured"
        return f"predicted with {self.table.label}" if self.table else "predicted"


def round_ratios(nchw: tuple[float, ...], channels_last: tuple[float, ...]) -> tuple[float, ...]:
    """The quartiles and median of the round-by-round ratios (NCHW over channels_last)."""
    ratios = [n / c for n, c in zip(nchw, channels_last, strict=True) if c > 0]
    if len(ratios) < 2:
        return (ratios[0],) * 3 if ratios else ()
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, median, q3
