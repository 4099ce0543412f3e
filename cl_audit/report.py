"""Report data model: frozen dataclasses and their versioned JSON envelope."""

from __future__ import annotations

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

    @property
    def op(self) -> str:
        """The most user-facing name of the operation."""
        return self.python_op or self.aten_op or "?"


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
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ReportFormatError(f"not JSON: {e}") from None
        return cls.from_dict(data)


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
