"""Bench report data model: per-strategy timings, the attribution of step time to the audit's
findings, the ``cl-audit.bench`` JSON envelope and the PyTorch OSS benchmark-database export."""

from __future__ import annotations

import json
import platform
import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from cl_audit.enums import BenchVerdict, Conversion, Phase, Strategy
from cl_audit.report import (
    BENCH_FORMAT,
    BENCH_READABLE,
    BENCH_VERSION,
    Environment,
    read_envelope,
)
from cl_audit.report.codec import JsonForm, decode, encode

__all__ = [
    "BENCH_FORMAT",
    "BENCH_VERSION",
    "SPREAD_BOUND",
    "Attribution",
    "BenchReport",
    "Comparison",
    "FindingTime",
    "StrategyTiming",
    "configuration_name",
    "dashboard_records",
]

# Past this spread of a configuration's rounds ((slowest - fastest) / median) the machine was
# busy while they ran: the comparison is inconclusive, however the ratios fall. On the shared
# 2-core machine rounds spread by 18-88% (reports/pages/bench.md, repeatability); beside other
# work by 400-850% (issue #67).
SPREAD_BOUND = 1.0


def configuration_name(strategy: Strategy, amp: str | None) -> str:
    """How reports name a configuration: ``channels-last``, ``channels-last+bf16``."""
    return strategy.value + (f"+{amp}" if amp else "")


@dataclass(frozen=True)
class StrategyTiming:
    """One configuration timed: a strategy, with or without autocast. ``rounds_ms`` holds the
    time per step of each round (the mean of the round's steps), in the order they ran."""

    name: str  # "channels-last", "channels-last+bf16"
    strategy: Strategy
    amp: str | None  # autocast dtype ("bf16", "fp16") or None
    rounds_ms: tuple[float, ...]
    warmup_steps: int | None = None  # untimed steps run until settled (None: version 1)
    compiled: bool = False  # through torch.compile (version 4: ``--compile``)
    compile_seconds: float | None = None  # the compile's steps, apart from the rounds

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rounds_ms)

    @property
    def spread(self) -> float:
        """(slowest - fastest round) / median."""
        return (max(self.rounds_ms) - min(self.rounds_ms)) / self.median_ms


@dataclass(frozen=True)
class Comparison:
    """channels-last (``configuration``) against nchw (``baseline``) round by round: ``ratios``
    holds nchw's time over channels-last's in each round (>1: faster; the rounds alternate, so
    each pair ran side by side). The verdict is faster or slower only when the middle half of
    the ratios lies on one side of 1: the rounds' spread is smaller than the difference."""

    configuration: str
    baseline: str
    ratios: tuple[float, ...]
    rounds_spread: float = 0.0  # the wider of the two configurations' round spreads (bench 3)

    json_form: ClassVar[JsonForm] = JsonForm(
        derived=("speedup", "low", "high", "spread", "difference", "verdict")
    )

    @property
    def speedup(self) -> float:
        """The median round's ratio."""
        return statistics.median(self.ratios)

    @property
    def low(self) -> float:
        """The lower quartile of the ratios (the upper: ``high``)."""
        return self._quartiles[0]

    @property
    def high(self) -> float:
        return self._quartiles[1]

    @property
    def _quartiles(self) -> tuple[float, float]:
        if len(self.ratios) < 2:
            return self.ratios[0], self.ratios[0]
        q1, _, q3 = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return q1, q3

    @property
    def spread(self) -> float:
        """The middle half of the ratios' width, as a share of the median."""
        return (self.high - self.low) / self.speedup

    @property
    def difference(self) -> float:
        """How far the median ratio is from even, as a share (0.25: 1.25x either way)."""
        return max(self.speedup, 1 / self.speedup) - 1

    @property
    def busy(self) -> bool:
        """Whether a configuration's rounds spread past ``SPREAD_BOUND``: the machine was busy,
        and no ratio of such rounds is trusted, however they fall."""
        return self.rounds_spread > SPREAD_BOUND

    @property
    def verdict(self) -> BenchVerdict:
        if self.busy:
            return BenchVerdict.INCONCLUSIVE
        if self.low > 1:
            return BenchVerdict.FASTER
        if self.high < 1:
            return BenchVerdict.SLOWER
        return BenchVerdict.INCONCLUSIVE


@dataclass(frozen=True)
class FindingTime:
    """One flagged operation at one call site (modules folded), and its profiled time."""

    kind: Conversion
    offender: bool  # an offender (not a parameter conversion or a regain)
    op: str
    aten_op: str | None
    call_site: str | None
    module_path: str | None
    phase: Phase
    count: int
    ms: float


@dataclass(frozen=True)
class Attribution:
    """The audited step of one configuration under ``torch.profiler``: what its flagged
    operations take (``step_ms`` is that configuration's median from the timing rounds)."""

    configuration: str
    step_ms: float
    clock: str
    losses_ms: float  # offenders and parameter conversions
    regains_ms: float  # whole regaining operations (a convolution counts whole)
    findings: tuple[FindingTime, ...]
    offenders: int  # offender count of the audit

    json_form: ClassVar[JsonForm] = JsonForm(derived=("share",))

    @property
    def share(self) -> float:
        return self.losses_ms / self.step_ms if self.step_ms > 0 else 0.0


@dataclass(frozen=True)
class BenchReport:
    model: str
    input_shape: tuple[int, ...]
    environment: Environment
    threads: int
    warmup: int
    steps_per_round: int
    timings: tuple[StrategyTiming, ...]
    attribution: Attribution | None

    json_form: ClassVar[JsonForm] = JsonForm(
        derived=("verdict", "verdict_text", "comparison", "compiled_comparison")
    )

    def timing(self, name: str) -> StrategyTiming | None:
        return next((t for t in self.timings if t.name == name), None)

    def speedup(self, timing: StrategyTiming) -> float | None:
        """How many times faster than nchw at the same autocast (>1: faster)."""
        base = next(
            (
                t
                for t in self.timings
                if t.strategy is Strategy.NCHW
                and t.amp == timing.amp
                and t.compiled == timing.compiled
            ),
            None,
        )
        return None if base is None else base.median_ms / timing.median_ms

    def throughput(self, timing: StrategyTiming) -> float:
        """Samples per second."""
        return self.input_shape[0] / (timing.median_ms / 1e3)

    @property
    def comparison(self) -> Comparison | None:
        """channels-last against nchw at the report's autocast, or None when one is missing."""
        return self._compared(compiled=False)

    @property
    def compiled_comparison(self) -> Comparison | None:
        """The same under torch.compile (``--compile``), or None."""
        return self._compared(compiled=True)

    def _compared(self, compiled: bool) -> Comparison | None:
        amp = self.environment.autocast is not None
        cl = next(
            (
                t
                for t in self.timings
                if t.strategy is Strategy.CHANNELS_LAST
                and (t.amp is not None) == amp
                and t.compiled == compiled
            ),
            None,
        )
        base = next(
            (
                t
                for t in self.timings
                if t.strategy is Strategy.NCHW and cl and t.amp == cl.amp and t.compiled == compiled
            ),
            None,
        )
        if cl is None or base is None:
            return None
        paired = zip(base.rounds_ms, cl.rounds_ms, strict=False)
        ratios = tuple(b / c for b, c in paired if c > 0)
        return Comparison(cl.name, base.name, ratios, max(cl.spread, base.spread))

    @property
    def verdict(self) -> BenchVerdict:
        comparison = self.comparison
        return BenchVerdict.NOT_COMPARED if comparison is None else comparison.verdict

    @property
    def verdict_text(self) -> str:
        """One line: how channels-last compares with nchw (when the rounds can tell), and what
        its conversions take; with compiled configurations, how they compare too."""
        line = self._verdict_line(self.comparison, attributed=True)
        compiled = self.compiled_comparison
        if compiled is not None:
            line += f"; compiled: {self._verdict_line(compiled, attributed=False)}"
        return line

    def _verdict_line(self, c: Comparison | None, attributed: bool) -> str:
        if c is None:
            return "channels-last was not compared with nchw"
        timing = next(t for t in self.timings if t.name == c.configuration)
        medians = self.speedup(timing) or c.speedup  # the table's figure
        if c.busy:
            line = (
                f"inconclusive: the rounds spread by {c.rounds_spread:.0%} of their median (past "
                f"the {SPREAD_BOUND:.0%} bound: the machine was busy); {c.configuration} ran "
                f"{medians:.2f}x the speed of {c.baseline} (median steps); run again on a "
                "quieter machine"
            )
        elif c.verdict is BenchVerdict.INCONCLUSIVE:
            line = (
                f"inconclusive: {c.configuration} ran {medians:.2f}x the speed of {c.baseline} "
                f"(median steps), {c.low:.2f}x-{c.high:.2f}x round by round (middle half of "
                f"{len(c.ratios)} rounds): a {c.spread:.0%} spread against a "
                f"{abs(max(medians, 1 / medians) - 1):.0%} difference; run again on a quieter "
                "machine or with more --rounds"
            )
        else:  # the table's figure, the median steps' ratio, with the rounds' range beside it
            how = f"{medians:.2f}x faster" if medians >= 1 else f"{1 / medians:.2f}x slower"
            line = (
                f"{c.configuration} is {how} than {c.baseline} (median steps; "
                f"{c.low:.2f}x-{c.high:.2f}x round by round)"
            )
        a = self.attribution
        if attributed and a is not None and a.configuration == c.configuration:
            line += f"; conversions take {a.share:.0%} of its step"
        return line

    def to_dict(self) -> dict[str, Any]:
        """Each timing's figures added here: its speedup and throughput need the whole report."""
        body = encode(self)
        for plain, timing in zip(body["timings"], self.timings, strict=True):
            plain.update(
                median_ms=timing.median_ms,
                min_ms=min(timing.rounds_ms),
                max_ms=max(timing.rounds_ms),
                spread=timing.spread,
                throughput=self.throughput(timing),
                speedup_vs_nchw=self.speedup(timing),
            )
        return {"format": BENCH_FORMAT, "version": BENCH_VERSION, **body}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchReport:
        return read_envelope(data, BENCH_FORMAT, BENCH_READABLE, lambda _: decode(cls, data))


def dashboard_records(report: BenchReport, source: str) -> list[dict[str, Any]]:
    """Records in the format of PyTorch's OSS benchmark database (``benchmark``, ``model``,
    ``metric`` per record, as operator_benchmark's ``--output-json-for-dashboard`` writes):
    latency (every round), throughput and speedup over nchw per configuration, and the
    conversions' share of the attributed one."""
    env = report.environment
    mode = "training" if env.train else "inference"
    arch = platform.processor() or platform.machine()
    records = []
    for timing in report.timings:
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(timing.amp or "", env.dtype or "")
        benchmark = {
            "name": "cl-audit bench",
            "mode": mode,
            "dtype": dtype,
            "extra_info": {
                "device": env.device,
                "arch": arch,
                "strategy": timing.strategy.value,
                "autocast": timing.amp,
                "threads": report.threads,
                "input_shape": list(report.input_shape),
                "torch": env.torch,
            },
        }
        model = {
            "name": report.model,
            "type": "vision",
            "origins": [source],
            "extra_info": {"configuration": timing.name},
        }
        metrics = [("latency", "ms", list(timing.rounds_ms))]
        metrics.append(("throughput", "samples/s", [report.throughput(timing)]))
        speedup = report.speedup(timing)
        if speedup is not None:
            metrics.append(("speedup_vs_nchw", "x", [speedup]))
        a = report.attribution
        if a is not None and a.configuration == timing.name:
            metrics.append(("conversion_share", "fraction", [a.share]))
        for name, unit, values in metrics:
            metric = {"name": name, "unit": unit, "benchmark_values": values, "target_value": None}
            records.append({"benchmark": benchmark, "model": model, "metric": metric})
    return records
