"""The report of one audit: findings, summary, environment, differential run and timing, as
frozen dataclasses, with their JSON (the current version written; every readable one read)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cl_audit.enums import (
    Conversion,
    Differential,
    DifferentialStatus,
    Engine,
    Phase,
    Provenance,
    RegainSource,
    Stage,
    TensorMode,
    Verdict,
)
from cl_audit.report.codec import JsonForm, decode, encode
from cl_audit.report.compiled_report import Compiled
from cl_audit.report.distributed_report import DdpCheck, FsdpCheck
from cl_audit.report.envelope import (
    REPORT_FORMAT,
    REPORT_READABLE,
    REPORT_VERSION,
    ReportFormatError,
    parse_json,
    read_envelope,
)
from cl_audit.report.speed_report import Speed, offends
from cl_audit.report.verdict import Cost, Producer
from cl_audit.rule.layout import MemoryLayout


@dataclass(frozen=True)
class TensorSummary:
    """Metadata of one tensor argument or result; never the tensor itself."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: str
    layout: MemoryLayout


@dataclass(frozen=True)
class Finding:
    """One conversion, merged over identical occurrences.

    ``round_trips`` counts the occurrences of a loss whose output was later converted back to
    channels_last (thrashing); ``terminal`` those never converted back. Both are 0 for regains.
    ``root_cause`` is set when the operation mixed channels_last and contiguous inputs and the
    producer of the contiguous one was seen.
    """

    kind: Conversion
    python_op: str | None
    aten_op: str | None
    module_path: str | None
    module_class: str | None
    call_site: str | None
    inputs: tuple[TensorSummary, ...]
    outputs: tuple[TensorSummary, ...]
    count: int
    bytes_converted: int
    round_trips: int
    terminal: int
    mixed_formats: bool
    root_cause: Producer | None
    provenance: Provenance = Provenance.BATCH
    regain_source: RegainSource | None = None  # regains only
    differential: Differential | None = None  # terminal losses compared with an NCHW run
    phase: Phase = Phase.FORWARD
    time_ms: float | None = None  # with --time: the profiled time of its calls, one step

    @property
    def op(self) -> str:
        """The most user-facing name of the operation (``torch.flatten``), for display."""
        return self.python_op or self.aten_op or "?"

    @property
    def op_id(self) -> str:
        """The identity of the operation (``aten.clone``), for grouping and comparing."""
        return self.aten_op or self.python_op or "?"


@dataclass(frozen=True)
class TimelineEvent:
    """One operation with a 4D/5D output, in the order the forward ran them: the format
    timeline of the HTML report. ``mark`` says when the operation lost or regained the format."""

    op: str
    module_path: str | None
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    layout: MemoryLayout
    mark: Conversion | None


@dataclass(frozen=True)
class SiteGroup:
    """The findings of one operation at one call site, folded over the modules it ran in (a
    block repeated 22 times is one group). ``first`` is the largest and stands for the rest."""

    first: Finding
    module_paths: tuple[str | None, ...]
    count: int
    bytes_converted: int
    round_trips: int
    terminal: int
    time_ms: float | None = None  # with --time


def by_call_site(findings: tuple[Finding, ...]) -> tuple[SiteGroup, ...]:
    """Findings grouped by op, call site, root cause and verdict; most bytes first."""
    groups: dict[tuple[Any, ...], list[Finding]] = {}
    for f in findings:
        cause = f.root_cause
        key = (
            f.python_op,
            f.aten_op,
            f.call_site,
            None if cause is None else (cause.python_op, cause.aten_op, cause.call_site),
            f.differential,
            f.provenance,
            f.phase,
        )
        groups.setdefault(key, []).append(f)
    folded = []
    for members in groups.values():
        members.sort(key=lambda f: -f.bytes_converted)
        paths = tuple(dict.fromkeys(f.module_path for f in members))
        folded.append(
            SiteGroup(
                first=members[0],
                module_paths=paths,
                count=sum(f.count for f in members),
                bytes_converted=sum(f.bytes_converted for f in members),
                round_trips=sum(f.round_trips for f in members),
                terminal=sum(f.terminal for f in members),
                time_ms=None
                if members[0].time_ms is None
                else sum(f.time_ms or 0.0 for f in members),
            )
        )
    return tuple(sorted(folded, key=lambda g: (-g.bytes_converted, -g.count)))


@dataclass(frozen=True)
class Summary:
    """Counts over ``offenders`` (losses, round trips, terminal, offending ops) and the regains
    of activations (a convolution that regains from a standardised weight is a parameter
    matter); the parameter and format-neutral lists are counted apart."""

    calls_checked: int
    distinct_ops: int
    offending_ops: int
    losses: int
    regains: int
    round_trips: int
    terminal_conversions: int
    bytes_converted: int  # written by the offenders and the regains of activations
    parameter_conversions: int = 0
    parameter_bytes: int = 0
    format_neutral: int = 0
    format_neutral_bytes: int = 0
    # The cost's verdict when an NCHW comparison weighed it (``ModelReport.cost``); without one
    # (the patch engine, the audit() context manager) OFFENDING when there are offenders.
    verdict: Verdict = Verdict.CLEAN


def summarise(
    calls_checked: int,
    distinct_ops: int,
    offenders: tuple[Finding, ...],
    regains: tuple[Finding, ...],
    parameter_conversions: tuple[Finding, ...] = (),
    format_neutral: tuple[Finding, ...] = (),
) -> Summary:
    activations = tuple(f for f in regains if f.provenance is Provenance.BATCH)
    return Summary(
        calls_checked=calls_checked,
        distinct_ops=distinct_ops,
        offending_ops=len({f.op_id for f in offenders}),
        losses=sum(f.count for f in offenders),
        regains=sum(f.count for f in activations),
        round_trips=sum(f.round_trips for f in offenders),
        terminal_conversions=sum(f.terminal for f in offenders),
        bytes_converted=sum(f.bytes_converted for f in (*offenders, *activations)),
        parameter_conversions=sum(f.count for f in parameter_conversions),
        parameter_bytes=sum(f.bytes_converted for f in parameter_conversions),
        format_neutral=sum(f.count for f in format_neutral),
        format_neutral_bytes=sum(f.bytes_converted for f in format_neutral),
        verdict=Verdict.OFFENDING if offenders else Verdict.CLEAN,
    )


def with_verdict(data: dict[str, Any]) -> dict[str, Any]:
    """A report or sweep row as written, its summary with a verdict: one written before verdicts
    (versions 1 and 2) gets that of its findings (offending when there are offenders); a speed
    section that named its table alone (report versions 13, sweep 9) has it as a table whose
    machine is not known."""
    speed = data.get("speed")
    if isinstance(speed, dict) and isinstance(speed.get("table"), str):
        data = {**data, "speed": {**speed, "table": {"name": speed["table"]}}}
    summary = data.get("summary")
    if summary is None or summary.get("verdict") is not None:
        return data
    verdict = Verdict.OFFENDING if data["offenders"] else Verdict.CLEAN
    return {**data, "summary": {**summary, "verdict": verdict.value}}


@dataclass(frozen=True)
class AppliedOverride:
    """A CUDA kernel-source override that changed an operation's output in a fake CUDA run:
    the operation, how many times, and the source it was read from."""

    op: str
    applied: int
    source: str


@dataclass(frozen=True)
class Environment:
    tool: str
    python: str
    torch: str
    torchvision: str | None
    timm: str | None
    device: str | None
    dtype: str | None
    autocast: str | None
    engine: Engine
    mode: TensorMode = TensorMode.EAGER
    train: bool = False  # a training step: forward, backward and optimizer step
    optimizer: str | None = None  # sgd/adamw (cl-audit's step), a framework's class name
    fake_divergences: str | None = None  # fake runs: the divergence table that applies
    kernel_overrides: tuple[AppliedOverride, ...] = ()  # fake CUDA: predicted from kernel source


@dataclass(frozen=True)
class GradientLayout:
    """A parameter whose gradient came back with other strides than the parameter's: what DDP
    reports as "grad strides do not match bucket view strides"."""

    parameter: str
    shape: tuple[int, ...]
    parameter_strides: tuple[int, ...]
    gradient_strides: tuple[int, ...]


@dataclass(frozen=True)
class Timing:
    """With ``--time``: the step's own time and the profiled time of the flagged operations.

    ``step_ms`` is the median of ``rounds_ms``, each a round's milliseconds per step, timed
    without the audit in the rounds the speed section reads (one measurement); the flagged
    operations were timed by ``torch.profiler`` in the audited step (``clock``: ``cpu`` is the
    profiler's CPU time, ``cuda`` the kernels' time). An operation that converts while doing
    other work (an activation's backward) counts whole: the figures are upper bounds of what the
    conversions cost. A regain is most often a convolution converting its input back: its whole
    time is in ``regains_ms``, kept apart from the losses' share.
    """

    clock: str
    threads: int
    step_ms: float
    rounds_ms: tuple[float, ...]
    profiled_step_ms: float  # the audited step under the profiler (instrumented: slower)
    offenders_ms: float
    regains_ms: float
    parameter_ms: float

    json_form: ClassVar[JsonForm] = JsonForm(derived=("losses_ms", "share", "regain_share"))

    @property
    def losses_ms(self) -> float:
        """The losses' time: offenders and parameter conversions."""
        return self.offenders_ms + self.parameter_ms

    @property
    def share(self) -> float:
        """The losses' share of an uninstrumented step."""
        return self.losses_ms / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def regain_share(self) -> float:
        """The regaining operations' share (whole operations: a convolution counts whole)."""
        return self.regains_ms / self.step_ms if self.step_ms > 0 else 0.0


@dataclass(frozen=True)
class DifferentialRun:
    status: DifferentialStatus
    message: str | None = None  # why it was skipped or failed
    unaligned: int = 0  # terminal losses with no counterpart in the NCHW run


@dataclass(frozen=True)
class ModelReport:
    """Everything one audit saw. ``offenders`` are the activation losses that thrash or that
    channels_last added; regains, parameter conversions and format-neutral losses are apart."""

    model: str | None
    input_shape: tuple[int, ...] | None
    environment: Environment
    summary: Summary
    offenders: tuple[Finding, ...]
    regains: tuple[Finding, ...]
    parameter_conversions: tuple[Finding, ...] = ()
    format_neutral: tuple[Finding, ...] = ()
    differential: DifferentialRun = DifferentialRun(DifferentialStatus.SKIPPED)
    unwrapped: tuple[str, ...] = field(default=())
    timeline: tuple[TimelineEvent, ...] = ()  # recorded when asked (--html): it costs time
    gradient_layouts: tuple[GradientLayout, ...] = ()  # training audits only
    timing: Timing | None = None  # with --time
    cost: Cost | None = None  # channels_last against the same forward or step in NCHW
    compiled: Compiled | None = None  # with --compile: Inductor's layout decision per graph
    ddp: DdpCheck | None = None  # with --train --ddp: the step under DDP, per configuration
    fsdp: FsdpCheck | None = None  # with --train --fsdp: the FSDP pre-flight
    speed: Speed | None = None  # whether channels_last pays: measured (--time) or predicted

    @property
    def verdict(self) -> Verdict:
        return self.summary.verdict

    @property
    def predicted(self) -> bool:
        return self.environment.mode is not TensorMode.EAGER

    @property
    def offending(self) -> bool:
        """Whether the gate fails this model (exit 1): on bytes, or on speed."""
        return offends(self.verdict, self.cost, self.speed)

    def to_dict(self) -> dict[str, Any]:
        return {"format": REPORT_FORMAT, "version": REPORT_VERSION, **encode(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelReport:
        if isinstance(data, dict) and data.get("status") == "error":
            raise ReportFormatError(
                f"a failed run's report ({data.get('stage')}: {data.get('message')}): no verdict"
            )
        return read_envelope(
            data, REPORT_FORMAT, REPORT_READABLE, lambda v: decode(cls, _upgraded(data, v))
        )

    @classmethod
    def from_json(cls, text: str) -> ModelReport:
        return cls.from_dict(parse_json(text))


@dataclass(frozen=True)
class FailedRun:
    """What ``--json`` holds for a run that failed after its outputs were named (report
    envelope 13): where it failed and why, so that no earlier run's verdict stays in its
    place. The exit code is the failure's (3)."""

    model: str | None
    stage: Stage
    message: str
    status: str = "error"

    def to_dict(self) -> dict[str, Any]:
        return {"format": REPORT_FORMAT, "version": REPORT_VERSION, **encode(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def _upgraded(data: dict[str, Any], version: int) -> dict[str, Any]:
    """The document with what older versions left out filled in; explicit, as it depends on the
    version and on other fields: versions 1 and 2 wrote no verdict, version 1 no differential run
    (read as skipped, saying why)."""
    data = with_verdict(data)
    if data.get("differential") is None:
        message = "version 1 report: made before differential audits" if version == 1 else None
        data = {
            **data,
            "differential": {"status": DifferentialStatus.SKIPPED.value, "message": message},
        }
    return data
