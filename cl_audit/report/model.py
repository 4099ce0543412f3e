"""The report of one audit: findings, summary, environment, differential run and timing, as
frozen dataclasses, with their JSON (the current version written; every readable one read)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from cl_audit.enums import (
    Conversion,
    Differential,
    DifferentialStatus,
    Engine,
    Phase,
    Provenance,
    RegainSource,
    TensorMode,
    Verdict,
)
from cl_audit.layout import MemoryLayout
from cl_audit.report.compiled import Compiled, compiled_from_dict
from cl_audit.report.cost import Cost, Producer, cost_from_dict
from cl_audit.report.envelope import (
    REPORT_FORMAT,
    REPORT_READABLE,
    REPORT_VERSION,
    ReportFormatError,
    check_envelope,
    parse_json,
    plain_json,
)


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


def summary_from_dict(data: dict[str, Any], offenders: tuple[Finding, ...]) -> Summary:
    """A summary as written; one written before verdicts (versions 1 and 2) gets the verdict of
    its findings."""
    verdict = data.get("verdict")
    if verdict is None:
        verdict = Verdict.OFFENDING if offenders else Verdict.CLEAN
    return Summary(**{**data, "verdict": Verdict(verdict)})


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

    ``step_ms`` is the median of ``rounds_ms``, steps timed without the audit; the flagged
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

    @property
    def verdict(self) -> Verdict:
        return self.summary.verdict

    @property
    def predicted(self) -> bool:
        return self.environment.mode is TensorMode.FAKE

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        if self.timing is not None:
            timing = self.timing
            body["timing"].update(
                losses_ms=timing.losses_ms, share=timing.share, regain_share=timing.regain_share
            )
        if self.cost is not None:
            body["cost"] = self.cost.to_dict()
        if self.compiled is not None:
            body["compiled"] = self.compiled.to_dict()
        return {"format": REPORT_FORMAT, "version": REPORT_VERSION, **plain_json(body)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelReport:
        version = check_envelope(data, REPORT_FORMAT, REPORT_READABLE)
        try:
            differential = data.get("differential")
            offenders = findings_from_dicts(data["offenders"])
            return cls(
                model=data["model"],
                input_shape=tuple_or_none(data["input_shape"]),
                environment=environment_from_dict(data["environment"]),
                summary=summary_from_dict(data["summary"], offenders),
                offenders=offenders,
                regains=findings_from_dicts(data["regains"]),
                parameter_conversions=findings_from_dicts(data.get("parameter_conversions", ())),
                format_neutral=findings_from_dicts(data.get("format_neutral", ())),
                differential=_differential(differential, version),
                unwrapped=tuple(data.get("unwrapped", ())),
                timeline=tuple(_event(e) for e in data.get("timeline", ())),
                gradient_layouts=tuple(
                    GradientLayout(
                        g["parameter"],
                        tuple(g["shape"]),
                        tuple(g["parameter_strides"]),
                        tuple(g["gradient_strides"]),
                    )
                    for g in data.get("gradient_layouts", ())
                ),
                timing=_timing(data.get("timing")),
                cost=cost_from_dict(data.get("cost")),
                compiled=compiled_from_dict(data.get("compiled")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ReportFormatError(f"malformed {REPORT_FORMAT} document: {e!r}") from None

    @classmethod
    def from_json(cls, text: str) -> ModelReport:
        return cls.from_dict(parse_json(text))


def tuple_or_none(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def environment_from_dict(data: dict[str, Any]) -> Environment:
    overrides = tuple(AppliedOverride(**o) for o in data.get("kernel_overrides", ()))
    mode = TensorMode(data.get("mode", "eager"))
    engine = Engine(data["engine"])
    return Environment(**{**data, "engine": engine, "mode": mode, "kernel_overrides": overrides})


def _differential(data: dict[str, Any] | None, version: int) -> DifferentialRun:
    if data is None:
        message = "version 1 report: made before differential audits" if version == 1 else None
        return DifferentialRun(DifferentialStatus.SKIPPED, message)
    return DifferentialRun(DifferentialStatus(data["status"]), data["message"], data["unaligned"])


def _timing(data: dict[str, Any] | None) -> Timing | None:
    if data is None:
        return None
    derived = ("losses_ms", "share", "regain_share")
    fields = {k: v for k, v in data.items() if k not in derived}
    return Timing(**{**fields, "rounds_ms": tuple(data["rounds_ms"])})


def _tensor(data: dict[str, Any]) -> TensorSummary:
    return TensorSummary(
        shape=tuple(data["shape"]),
        strides=tuple(data["strides"]),
        dtype=data["dtype"],
        device=data["device"],
        layout=MemoryLayout(data["layout"]),
    )


def _event(data: dict[str, Any]) -> TimelineEvent:
    mark = data["mark"]
    return TimelineEvent(
        op=data["op"],
        module_path=data["module_path"],
        shape=tuple(data["shape"]),
        strides=tuple(data["strides"]),
        layout=MemoryLayout(data["layout"]),
        mark=None if mark is None else Conversion(mark),
    )


def _finding(data: dict[str, Any]) -> Finding:
    root = data["root_cause"]
    source = data.get("regain_source")
    differential = data.get("differential")
    return Finding(
        kind=Conversion(data["kind"]),
        python_op=data["python_op"],
        aten_op=data["aten_op"],
        module_path=data["module_path"],
        module_class=data["module_class"],
        call_site=data["call_site"],
        inputs=tuple(_tensor(t) for t in data["inputs"]),
        outputs=tuple(_tensor(t) for t in data["outputs"]),
        count=data["count"],
        bytes_converted=data["bytes_converted"],
        round_trips=data["round_trips"],
        terminal=data["terminal"],
        mixed_formats=data["mixed_formats"],
        root_cause=None if root is None else Producer(**root),
        provenance=Provenance(data.get("provenance", "batch")),
        regain_source=None if source is None else RegainSource(source),
        differential=None if differential is None else Differential(differential),
        phase=Phase(data.get("phase", "forward")),
        time_ms=data.get("time_ms"),
    )


def findings_from_dicts(items: Any) -> tuple[Finding, ...]:
    return tuple(_finding(f) for f in items)


# --- Sweeps -------------------------------------------------------------------------------
