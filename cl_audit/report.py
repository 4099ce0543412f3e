"""Report data model: frozen dataclasses and their versioned JSON envelope."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from enum import Enum, unique
from importlib import resources
from typing import Any

from cl_audit.layout import MemoryLayout

__all__ = [
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "Conversion",
    "Environment",
    "Finding",
    "ModelReport",
    "Producer",
    "ReportFormatError",
    "Summary",
    "TensorSummary",
    "load_schema",
]

REPORT_FORMAT = "cl-audit.report"
REPORT_VERSION = 1


class ReportFormatError(ValueError):
    """A JSON document is not a cl-audit report this version can read."""


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

    @property
    def op(self) -> str:
        """The most user-facing name of the operation (``torch.flatten``), for display."""
        return self.python_op or self.aten_op or "?"

    @property
    def op_id(self) -> str:
        """The identity of the operation (``aten.clone``), for grouping and comparing."""
        return self.aten_op or self.python_op or "?"


@dataclass(frozen=True)
class Summary:
    calls_checked: int
    distinct_ops: int
    offending_ops: int
    losses: int
    regains: int
    round_trips: int
    terminal_conversions: int
    bytes_converted: int


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
    mode: str = "eager"  # "fake": fake tensors, no kernel ran (a prediction)


@dataclass(frozen=True)
class ModelReport:
    """Everything one audit saw. ``offenders`` holds losses only; regains are listed apart."""

    model: str | None
    input_shape: tuple[int, ...] | None
    environment: Environment
    summary: Summary
    offenders: tuple[Finding, ...]
    regains: tuple[Finding, ...]
    unwrapped: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        return {"format": REPORT_FORMAT, "version": REPORT_VERSION, **_plain(body)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelReport:
        check_envelope(data, REPORT_FORMAT, REPORT_VERSION)
        try:
            return cls(
                model=data["model"],
                input_shape=_tuple_or_none(data["input_shape"]),
                environment=Environment(**data["environment"]),
                summary=Summary(**data["summary"]),
                offenders=tuple(_finding(f) for f in data["offenders"]),
                regains=tuple(_finding(f) for f in data["regains"]),
                unwrapped=tuple(data.get("unwrapped", ())),
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


def check_envelope(data: Any, expected_format: str, expected_version: int) -> None:
    """Refuse documents of another format or version with a message that says which."""
    if not isinstance(data, dict) or "format" not in data:
        raise ReportFormatError(f"not a {expected_format} document (no 'format' key)")
    if data["format"] != expected_format:
        raise ReportFormatError(f"unknown format {data['format']!r}; expected {expected_format!r}")
    if data.get("version") != expected_version:
        raise ReportFormatError(
            f"unsupported {expected_format} version {data.get('version')!r}; "
            f"this cl-audit reads version {expected_version}"
        )


def load_schema(name: str = "report") -> dict[str, Any]:
    """The JSON Schema shipped in the package for ``cl-audit.<name>`` documents."""
    text = resources.files("cl_audit.schema").joinpath(f"{name}.schema.json").read_text()
    return json.loads(text)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _tuple_or_none(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(value)


def _tensor(data: dict[str, Any]) -> TensorSummary:
    return TensorSummary(
        shape=tuple(data["shape"]),
        strides=tuple(data["strides"]),
        dtype=data["dtype"],
        device=data["device"],
        layout=MemoryLayout(data["layout"]),
    )


def _finding(data: dict[str, Any]) -> Finding:
    root = data["root_cause"]
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
    )


# --- Sweeps -------------------------------------------------------------------------------

SWEEP_FORMAT = "cl-audit.sweep"
SWEEP_VERSION = 1


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
    EAGER = "eager"  # a real forward pass on the device
    FAKE = "fake"  # fake tensors: layouts from the ops' meta functions, no data
    CONFIRMED = "fake+eager"  # fake mode flagged or failed it, and this is the eager re-run


@dataclass(frozen=True)
class ModelRow:
    """One model of a sweep. ``predicted`` rows come from fake tensors on a device not run."""

    name: str
    source: str
    status: Status
    mode: Mode
    predicted: bool
    input_shape: tuple[int, ...] | None
    parameters: int | None
    summary: Summary | None
    offenders: tuple[Finding, ...]
    message: str | None  # the error, or why it was skipped
    stage: str | None
    seconds: float
    peak_memory_mb: float | None

    @property
    def key(self) -> str:
        return f"{self.source}:{self.name}"

    @property
    def offending(self) -> bool:
        return self.status is Status.OK and bool(self.offenders)

    def to_dict(self) -> dict[str, Any]:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelRow:
        summary = data["summary"]
        return cls(
            name=data["name"],
            source=data["source"],
            status=Status(data["status"]),
            mode=Mode(data["mode"]),
            predicted=data["predicted"],
            input_shape=_tuple_or_none(data["input_shape"]),
            parameters=data["parameters"],
            summary=None if summary is None else Summary(**summary),
            offenders=tuple(_finding(f) for f in data["offenders"]),
            message=data["message"],
            stage=data["stage"],
            seconds=data["seconds"],
            peak_memory_mb=data["peak_memory_mb"],
        )


@dataclass(frozen=True)
class OperatorCoverage:
    """How one offending operation breaks channels_last across the models of a sweep."""

    op: str  # the aten name where known, else the Python-level one
    python_ops: tuple[str, ...]
    models: int
    events: int
    bytes_converted: int
    examples: tuple[str, ...]  # "model:module.path" for a few of the places


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
        ordered = tuple(sorted(rows, key=lambda r: (r.source, r.name)))
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
        return {"format": SWEEP_FORMAT, "version": SWEEP_VERSION, **_plain(asdict(self))}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepReport:
        check_envelope(data, SWEEP_FORMAT, SWEEP_VERSION)
        try:
            rows = [ModelRow.from_dict(r) for r in data["models"]]
            return cls.build(Environment(**data["environment"]), dict(data["settings"]), rows)
        except (KeyError, TypeError, ValueError) as e:
            raise ReportFormatError(f"malformed {SWEEP_FORMAT} document: {e!r}") from None

    @classmethod
    def from_json(cls, text: str) -> SweepReport:
        return cls.from_dict(_parse_json(text))

    @classmethod
    def from_bytes(cls, data: bytes) -> SweepReport:
        """JSON as written by ``--json``, gzip-compressed or not."""
        if data[:2] == _GZIP_MAGIC:
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError) as e:
                raise ReportFormatError(f"broken gzip data: {e}") from None
        return cls.from_json(data.decode())


_EXAMPLES_PER_OPERATOR = 5
_GZIP_MAGIC = b"\x1f\x8b"


def operator_coverage(rows: tuple[ModelRow, ...]) -> tuple[OperatorCoverage, ...]:
    """For each offending op: models broken, events, bytes and example places; worst first."""
    tallies: dict[str, dict[str, Any]] = {}
    for row in rows:
        if not row.offending:
            continue
        for finding in row.offenders:
            op = finding.aten_op or finding.python_op or "?"
            tally = tallies.setdefault(
                op, {"python": set(), "models": set(), "events": 0, "bytes": 0, "examples": []}
            )
            if finding.python_op:
                tally["python"].add(finding.python_op)
            tally["models"].add(row.key)
            tally["events"] += finding.count
            tally["bytes"] += finding.bytes_converted
            example = f"{row.name}:{finding.module_path}"
            if len(tally["examples"]) < _EXAMPLES_PER_OPERATOR and example not in tally["examples"]:
                tally["examples"].append(example)
    coverage = [
        OperatorCoverage(
            op=op,
            python_ops=tuple(sorted(t["python"])),
            models=len(t["models"]),
            events=t["events"],
            bytes_converted=t["bytes"],
            examples=tuple(t["examples"]),
        )
        for op, t in tallies.items()
    ]
    return tuple(sorted(coverage, key=lambda c: (-c.models, -c.events, c.op)))
