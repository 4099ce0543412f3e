"""Report data model: frozen dataclasses and their versioned JSON envelopes.

Version 2 (this one) sorts losses by what they mean: ``offenders`` are activation conversions
that thrash (round trips) or that channels_last added (terminal, caused);
``parameter_conversions`` and ``format_neutral`` are kept apart. Version 1 documents are still
read: their offenders are taken as they were written, with the new lists empty.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from enum import Enum, unique
from importlib import resources
from typing import Any

from cl_audit.errors import Stage
from cl_audit.layout import MemoryLayout

__all__ = [
    "BENCH_FORMAT",
    "BENCH_VERSION",
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "SWEEP_FORMAT",
    "SWEEP_VERSION",
    "AppliedOverride",
    "Conversion",
    "Differential",
    "DifferentialRun",
    "DifferentialStatus",
    "Environment",
    "Finding",
    "GradientLayout",
    "Mode",
    "ModelReport",
    "ModelRow",
    "ModelSource",
    "OperatorCoverage",
    "Phase",
    "Producer",
    "Provenance",
    "RegainSource",
    "ReportFormatError",
    "SiteGroup",
    "Status",
    "Summary",
    "SweepReport",
    "SweepSummary",
    "TensorMode",
    "TensorSummary",
    "TimelineEvent",
    "Timing",
    "by_call_site",
    "decode_document",
    "encode_document",
    "environment_from_dict",
    "load_schema",
    "plain_json",
    "summarise",
]

REPORT_FORMAT = "cl-audit.report"
REPORT_VERSION = 2
BENCH_FORMAT = "cl-audit.bench"  # cl_audit.bench_report
BENCH_VERSION = 1
_READABLE_VERSIONS = (1, 2)


class ReportFormatError(ValueError):
    """A JSON document is not a cl-audit report this version can read."""


@unique
class TensorMode(str, Enum):
    """How an audit ran its tensors."""

    EAGER = "eager"  # kernels ran on real data
    FAKE = "fake"  # FakeTensors: layouts from the operators' meta functions, a prediction


@unique
class ModelSource(str, Enum):
    """Where a model of a sweep or a CLI run comes from."""

    TORCHVISION = "torchvision"
    TIMM = "timm"
    USER = "user"  # module:factory or file.py:factory


@unique
class Phase(str, Enum):
    """When an operation ran in an audited training step."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


@unique
class Conversion(str, Enum):
    """Direction of a memory-format conversion."""

    LOSS = "loss"  # channels_last in, newly materialised contiguous out
    REGAIN = "regain"  # contiguous in, newly materialised channels_last out


@unique
class Provenance(str, Enum):
    """Where the data an operation converted comes from, traced by storage identity."""

    BATCH = "batch"  # the input batch and whatever it flows into: activations
    PARAMETER = "parameter"  # only parameters, buffers and constants made during the forward


@unique
class RegainSource(str, Enum):
    """What made the contiguous input of a regain."""

    LOSS = "loss"  # a recorded loss: the regain closes a round trip
    PRODUCER = "producer"  # an operation that is not a loss; ``root_cause`` names it
    OUTSIDE = "outside"  # data from outside the audit: the input, a parameter or buffer


@unique
class Differential(str, Enum):
    """A terminal loss compared with its counterpart in the same forward run in NCHW."""

    CAUSED = "caused"  # the counterpart ran on other strides: channels_last added this copy
    NEUTRAL = "neutral"  # same input and output strides in NCHW: channels_last changed nothing
    UNALIGNED = "unaligned"  # no counterpart found: counted as caused, and listed


@dataclass(frozen=True)
class TensorSummary:
    """Metadata of one tensor argument or result; never the tensor itself."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: str
    layout: MemoryLayout


@dataclass(frozen=True)
class Producer:
    """The operation that produced a contiguous tensor which later met channels_last data."""

    python_op: str | None
    aten_op: str | None
    module_path: str | None
    module_class: str | None
    call_site: str | None


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
    )


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
    engine: str
    mode: TensorMode = TensorMode.EAGER
    train: bool = False  # a training step: forward, backward and optimizer step
    optimizer: str | None = None
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


@unique
class DifferentialStatus(str, Enum):
    """Whether terminal losses were compared with a forward run in NCHW."""

    RAN = "ran"
    NOT_NEEDED = "not-needed"  # no terminal activation loss to classify
    SKIPPED = "skipped"  # not asked for (--no-differential, or the audit() context manager)
    FAILED = "failed"  # the NCHW run failed: every terminal loss counts as caused


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
        return {"format": REPORT_FORMAT, "version": REPORT_VERSION, **plain_json(body)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelReport:
        version = check_envelope(data, REPORT_FORMAT)
        try:
            differential = data.get("differential")
            return cls(
                model=data["model"],
                input_shape=_tuple_or_none(data["input_shape"]),
                environment=environment_from_dict(data["environment"]),
                summary=Summary(**data["summary"]),
                offenders=_findings(data["offenders"]),
                regains=_findings(data["regains"]),
                parameter_conversions=_findings(data.get("parameter_conversions", ())),
                format_neutral=_findings(data.get("format_neutral", ())),
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
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ReportFormatError(f"malformed {REPORT_FORMAT} document: {e!r}") from None

    @classmethod
    def from_json(cls, text: str) -> ModelReport:
        return cls.from_dict(_parse_json(text))


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportFormatError(f"not JSON: {e}") from None


_GZIP_MAGIC = b"\x1f\x8b"


def encode_document(text: str, compress: bool) -> bytes:
    """What ``decode_document`` reads: UTF-8, gzip-compressed (reproducibly) when asked."""
    data = text.encode()
    return gzip.compress(data, mtime=0) if compress else data


def decode_document(data: bytes) -> Any:
    """A JSON document as written by ``--json``, gzip-compressed or not."""
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ReportFormatError(f"broken gzip data: {e}") from None
    try:
        return _parse_json(data.decode())
    except UnicodeDecodeError as e:
        raise ReportFormatError(f"not text: {e}") from None


def check_envelope(
    data: Any, expected_format: str, readable: tuple[int, ...] = _READABLE_VERSIONS
) -> int:
    """The document's version; refuses other formats and versions with a message."""
    if not isinstance(data, dict) or "format" not in data:
        raise ReportFormatError(f"not a {expected_format} document (no 'format' key)")
    if data["format"] != expected_format:
        raise ReportFormatError(f"unknown format {data['format']!r}; expected {expected_format!r}")
    version = data.get("version")
    if version not in readable:
        raise ReportFormatError(
            f"unsupported {expected_format} version {version!r}; this cl-audit reads versions "
            f"{' and '.join(map(str, readable))}"
        )
    return version


def load_schema(name: str = "report", version: int | None = None) -> dict[str, Any]:
    """The JSON Schema shipped in the package for ``cl-audit.<name>`` documents (report, sweep,
    bench) of ``version`` (the current one by default)."""
    current = {"report": REPORT_VERSION, "sweep": SWEEP_VERSION, "bench": BENCH_VERSION}[name]
    version = current if version is None else version
    file = f"{name}.schema.json" if version == current else f"{name}-v{version}.schema.json"
    return json.loads(resources.files("cl_audit.schema").joinpath(file).read_text())


def plain_json(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


def _tuple_or_none(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def environment_from_dict(data: dict[str, Any]) -> Environment:
    overrides = tuple(AppliedOverride(**o) for o in data.get("kernel_overrides", ()))
    mode = TensorMode(data.get("mode", "eager"))
    return Environment(**{**data, "mode": mode, "kernel_overrides": overrides})


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


def _findings(items: Any) -> tuple[Finding, ...]:
    return tuple(_finding(f) for f in items)


# --- Sweeps -------------------------------------------------------------------------------

SWEEP_FORMAT = "cl-audit.sweep"
SWEEP_VERSION = 2


@unique
class Status(str, Enum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    OUT_OF_MEMORY = "out-of-memory"
    SKIPPED = "skipped"

    @property
    def failed(self) -> bool:
        return self in (Status.ERROR, Status.TIMEOUT, Status.OUT_OF_MEMORY)


@unique
class Mode(str, Enum):
    """How a sweep's row was obtained."""

    EAGER = "eager"  # a real forward pass on the device
    FAKE = "fake"  # fake tensors: layouts from the ops' meta functions, no data
    CONFIRMED = "fake+eager"  # fake mode flagged or failed it, and this is the eager re-run


@dataclass(frozen=True)
class ModelRow:
    """One model of a sweep. Rows of fake mode are ``predicted``: nothing ran on the device."""

    name: str
    source: ModelSource
    status: Status
    mode: Mode
    input_shape: tuple[int, ...] | None
    parameters: int | None
    summary: Summary | None
    offenders: tuple[Finding, ...]
    message: str | None  # the error, or why it was skipped
    stage: Stage | None
    seconds: float
    peak_memory_mb: float | None
    parameter_conversions: tuple[Finding, ...] = ()
    format_neutral: tuple[Finding, ...] = ()
    regains: tuple[Finding, ...] = ()  # each names its source: no regain goes unexplained
    kernel_overrides: tuple[AppliedOverride, ...] = ()  # fake CUDA: predicted from kernel source

    @property
    def key(self) -> str:
        return f"{self.source.value}:{self.name}"

    @property
    def predicted(self) -> bool:
        return self.mode is Mode.FAKE

    @property
    def offending(self) -> bool:
        return self.status is Status.OK and bool(self.offenders)

    def to_dict(self) -> dict[str, Any]:
        return {**plain_json(asdict(self)), "predicted": self.predicted}

    @classmethod
    def from_report(
        cls,
        report: ModelReport,
        name: str,
        source: ModelSource,
        mode: Mode,
        *,
        parameters: int | None = None,
        seconds: float = 0.0,
    ) -> ModelRow:
        """The row of a model that gave a verdict."""
        return cls(
            name=name,
            source=source,
            status=Status.OK,
            mode=mode,
            input_shape=report.input_shape,
            parameters=parameters,
            summary=report.summary,
            offenders=report.offenders,
            message=None,
            stage=None,
            seconds=seconds,
            peak_memory_mb=None,
            parameter_conversions=report.parameter_conversions,
            format_neutral=report.format_neutral,
            regains=report.regains,
            kernel_overrides=report.environment.kernel_overrides,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelRow:
        summary = data["summary"]
        stage = data["stage"]
        return cls(
            name=data["name"],
            source=ModelSource(data["source"]),
            status=Status(data["status"]),
            mode=Mode(data["mode"]),
            input_shape=_tuple_or_none(data["input_shape"]),
            parameters=data["parameters"],
            summary=None if summary is None else Summary(**summary),
            offenders=_findings(data["offenders"]),
            message=data["message"],
            stage=None if stage is None else Stage(stage),
            seconds=data["seconds"],
            peak_memory_mb=data["peak_memory_mb"],
            parameter_conversions=_findings(data.get("parameter_conversions", ())),
            format_neutral=_findings(data.get("format_neutral", ())),
            regains=_findings(data.get("regains", ())),
            kernel_overrides=tuple(AppliedOverride(**o) for o in data.get("kernel_overrides", ())),
        )


@dataclass(frozen=True)
class OperatorCoverage:
    """How one operation converts data across the models of a sweep: as an offender, as a
    parameter conversion, and as a format-neutral loss, each counted apart."""

    op: str  # Finding.op_id: the aten name where known, else the Python-level one
    python_ops: tuple[str, ...]
    models: int  # models where it is an offender
    events: int
    bytes_converted: int
    examples: tuple[str, ...]  # "model:module.path" for a few of the offender places
    parameter_models: int = 0
    parameter_events: int = 0
    parameter_bytes: int = 0
    neutral_models: int = 0
    neutral_events: int = 0
    neutral_bytes: int = 0


@dataclass(frozen=True)
class SweepSummary:
    models: int
    clean: int
    offending: int
    failed: int
    skipped: int
    by_status: dict[str, int]


@dataclass(frozen=True)
class SweepReport:
    environment: Environment
    settings: dict[str, Any]
    summary: SweepSummary
    models: tuple[ModelRow, ...]
    operators: tuple[OperatorCoverage, ...]

    @classmethod
    def build(
        cls, environment: Environment, settings: dict[str, Any], rows: list[ModelRow]
    ) -> SweepReport:
        """Summary and operator coverage derived from the rows, in a stable order."""
        ordered = tuple(sorted(rows, key=lambda r: (r.source.value, r.name)))
        by_status: dict[str, int] = {s.value: 0 for s in Status}
        for row in ordered:
            by_status[row.status.value] += 1
        summary = SweepSummary(
            models=len(ordered),
            clean=sum(1 for r in ordered if r.status is Status.OK and not r.offenders),
            offending=sum(1 for r in ordered if r.offending),
            failed=sum(1 for r in ordered if r.status.failed),
            skipped=by_status[Status.SKIPPED.value],
            by_status=by_status,
        )
        return cls(environment, settings, summary, ordered, operator_coverage(ordered))

    def to_dict(self) -> dict[str, Any]:
        body = {**plain_json(asdict(self)), "models": [row.to_dict() for row in self.models]}
        return {"format": SWEEP_FORMAT, "version": SWEEP_VERSION, **body}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepReport:
        check_envelope(data, SWEEP_FORMAT)
        try:
            rows = [ModelRow.from_dict(r) for r in data["models"]]
            return cls.build(
                environment_from_dict(data["environment"]), dict(data["settings"]), rows
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ReportFormatError(f"malformed {SWEEP_FORMAT} document: {e!r}") from None

    @classmethod
    def from_json(cls, text: str) -> SweepReport:
        return cls.from_dict(_parse_json(text))

    @classmethod
    def from_bytes(cls, data: bytes) -> SweepReport:
        """JSON as written by ``--json``, gzip-compressed or not."""
        return cls.from_dict(decode_document(data))


_EXAMPLES_PER_OPERATOR = 5


def _tally(tallies: dict[str, dict[str, Any]], row: ModelRow, finding: Finding, kind: str) -> None:
    tally = tallies.setdefault(
        finding.op_id,
        {"python": set(), "examples": [], **{f"{k}_{n}": 0 for k in _KINDS for n in _NUMBERS}},
    )
    tally.setdefault(f"{kind}_keys", set()).add(row.key)
    if finding.python_op:
        tally["python"].add(finding.python_op)
    tally[f"{kind}_events"] += finding.count
    tally[f"{kind}_bytes"] += finding.bytes_converted
    example = f"{row.name}:{finding.module_path}"
    if kind == "offender" and len(tally["examples"]) < _EXAMPLES_PER_OPERATOR:
        if example not in tally["examples"]:
            tally["examples"].append(example)


_KINDS = ("offender", "parameter", "neutral")
_NUMBERS = ("events", "bytes")


def operator_coverage(rows: tuple[ModelRow, ...]) -> tuple[OperatorCoverage, ...]:
    """For each converting op: models, events and bytes as an offender, as a parameter
    conversion and as a format-neutral loss, with example places; worst offenders first."""
    tallies: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.status is not Status.OK:
            continue
        lists = (row.offenders, row.parameter_conversions, row.format_neutral)
        for kind, findings in zip(_KINDS, lists, strict=True):
            for finding in findings:
                _tally(tallies, row, finding, kind)
    coverage = [
        OperatorCoverage(
            op=op,
            python_ops=tuple(sorted(t["python"])),
            models=len(t.get("offender_keys", ())),
            events=t["offender_events"],
            bytes_converted=t["offender_bytes"],
            examples=tuple(t["examples"]),
            parameter_models=len(t.get("parameter_keys", ())),
            parameter_events=t["parameter_events"],
            parameter_bytes=t["parameter_bytes"],
            neutral_models=len(t.get("neutral_keys", ())),
            neutral_events=t["neutral_events"],
            neutral_bytes=t["neutral_bytes"],
        )
        for op, t in tallies.items()
    ]
    order = lambda c: (-c.models, -c.events, -c.parameter_models, -c.neutral_models, c.op)  # noqa: E731
    return tuple(sorted(coverage, key=order))
