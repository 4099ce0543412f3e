"""The report of a sweep: one row per model, the summary, the operator-coverage index, and the
pure operations on sweep reports (merging shards, comparing with a baseline)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from cl_audit.enums import (
    Mode,
    ModelSource,
    Stage,
    Status,
    Verdict,
)
from cl_audit.errors import UsageError
from cl_audit.report.codec import JsonForm, decode, encode
from cl_audit.report.envelope import (
    SWEEP_FORMAT,
    SWEEP_READABLE,
    SWEEP_VERSION,
    decode_document,
    parse_json,
    read_envelope,
)
from cl_audit.report.model_report import (
    AppliedOverride,
    Environment,
    Finding,
    ModelReport,
    Summary,
    with_verdict,
)
from cl_audit.report.speed_report import Speed, offends
from cl_audit.report.verdict import Cost


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
    cost: Cost | None = None  # channels_last against NCHW, when weighed
    cached: bool = False  # an earlier run's row, reused from the sweep cache
    speed: Speed | None = None  # whether channels_last pays (sweep envelope 9)

    json_form: ClassVar[JsonForm] = JsonForm(derived=("predicted",))

    @property
    def key(self) -> str:
        return f"{self.source.value}:{self.name}"

    @property
    def predicted(self) -> bool:
        return self.mode is Mode.FAKE

    @property
    def verdict(self) -> Verdict | None:
        """The summary's verdict; None for a row that gave none (failed, skipped)."""
        if self.status is not Status.OK or self.summary is None:
            return None
        return self.summary.verdict

    @property
    def offending(self) -> bool:
        """Whether the gate fails this row: on bytes (the verdict), or on speed."""
        return self.status is Status.OK and offends(self.verdict, self.cost, self.speed)

    def to_dict(self) -> dict[str, Any]:
        return encode(self)

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
            cost=report.cost,
            speed=report.speed,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelRow:
        return decode(cls, with_verdict(data))


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
    cost_models: int = 0  # models where channels_last-only bytes are copied at this op
    extra_bytes: int = 0  # those bytes, summed over the models


@dataclass(frozen=True)
class SweepSummary:
    models: int
    clean: int
    offending: int
    minor: int
    failed: int
    skipped: int
    by_status: dict[str, int]
    cached: int = 0  # rows reused from the sweep cache


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
            clean=sum(1 for r in ordered if r.verdict is Verdict.CLEAN),
            offending=sum(1 for r in ordered if r.offending),
            minor=sum(1 for r in ordered if r.verdict is Verdict.MINOR),
            failed=sum(1 for r in ordered if r.status.failed),
            skipped=by_status[Status.SKIPPED.value],
            by_status=by_status,
            cached=sum(1 for r in ordered if r.cached),
        )
        return cls(environment, settings, summary, ordered, operator_coverage(ordered))

    def to_dict(self) -> dict[str, Any]:
        return {"format": SWEEP_FORMAT, "version": SWEEP_VERSION, **encode(self)}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepReport:
        """Explicit, not decoded: the summary and the operator coverage are derived again."""

        def read(_: int) -> SweepReport:
            rows = [ModelRow.from_dict(r) for r in data["models"]]
            return cls.build(decode(Environment, data["environment"]), dict(data["settings"]), rows)

        return read_envelope(data, SWEEP_FORMAT, SWEEP_READABLE, read)

    @classmethod
    def from_json(cls, text: str) -> SweepReport:
        return cls.from_dict(parse_json(text))

    @classmethod
    def from_bytes(cls, data: bytes) -> SweepReport:
        """JSON as written by ``--json``, gzip-compressed or not."""
        return cls.from_dict(decode_document(data))


_EXAMPLES_PER_OPERATOR = 5


def _new_tally() -> dict[str, Any]:
    return {"python": set(), "examples": [], **{f"{k}_{n}": 0 for k in _KINDS for n in _NUMBERS}}


def _tally(tallies: dict[str, dict[str, Any]], row: ModelRow, finding: Finding, kind: str) -> None:
    tally = tallies.setdefault(finding.op_id, _new_tally())
    tally.setdefault(f"{kind}_keys", set()).add(row.key)
    if finding.python_op:
        tally["python"].add(finding.python_op)
    tally[f"{kind}_events"] += finding.count
    tally[f"{kind}_bytes"] += finding.bytes_converted
    example = f"{row.name}:{finding.module_path}"
    if kind == "offender" and len(tally["examples"]) < _EXAMPLES_PER_OPERATOR:
        if example not in tally["examples"]:
            tally["examples"].append(example)


_KINDS = ("offender", "parameter", "neutral", "cost")


_NUMBERS = ("events", "bytes")


def operator_coverage(rows: tuple[ModelRow, ...]) -> tuple[OperatorCoverage, ...]:
    """For each converting op: the models and channels_last-only bytes of its cost sites;
    models, events and bytes as an offender, as a parameter conversion and as a format-neutral
    loss, with example places; the costliest first."""
    tallies: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.status is not Status.OK:
            continue
        lists = (row.offenders, row.parameter_conversions, row.format_neutral)
        for kind, findings in zip(_KINDS, lists, strict=False):
            for finding in findings:
                _tally(tallies, row, finding, kind)
        for site in row.cost.sites if row.cost is not None else ():
            if site.extra:
                tally = tallies.setdefault(site.aten_op or site.op, _new_tally())
                tally.setdefault("cost_keys", set()).add(row.key)
                tally["cost_bytes"] += site.extra
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
            cost_models=len(t.get("cost_keys", ())),
            extra_bytes=t["cost_bytes"],
        )
        for op, t in tallies.items()
    ]
    order = lambda c: (-c.extra_bytes, -c.models, -c.events, -c.parameter_models, c.op)  # noqa: E731
    return tuple(sorted(coverage, key=order))


def merge(reports: list[SweepReport], force: bool = False) -> SweepReport:
    """One report from shards. Refuses reports made by different cl-audit or torch versions,
    and models present in two of them, unless ``force`` (then the later one wins)."""
    if not reports:
        raise UsageError("merge: no reports given")
    first = reports[0].environment
    rows: dict[str, ModelRow] = {}
    for report in reports:
        env = report.environment
        if not force and (env.tool, env.torch) != (first.tool, first.torch):
            raise UsageError(
                f"merge: reports come from different versions (cl-audit {first.tool}, torch "
                f"{first.torch} vs cl-audit {env.tool}, torch {env.torch}); --force to merge"
            )
        for row in report.models:
            if row.key in rows and not force:
                raise UsageError(f"merge: {row.key} is in two reports; --force to keep the later")
            rows[row.key] = row
    settings = {k: v for k, v in reports[0].settings.items() if k != "shard"}
    settings["merged_from"] = len(reports)
    return SweepReport.build(first, settings, list(rows.values()))


def _offences(report: SweepReport) -> set[tuple[str, str]]:
    """(model key, op) of each offending row: its sites with channels_last-only bytes, or for
    a row weighed by no cost (versions 1 and 2) its offenders."""
    offences = set()
    for row in report.models:
        if not row.offending:
            continue
        if row.cost is not None:
            offences.update((row.key, s.aten_op or s.op) for s in row.cost.sites if s.extra)
        else:
            offences.update((row.key, f.op_id) for f in row.offenders)
    return offences


def _grown(baseline: SweepReport, current: SweepReport) -> tuple[str, ...]:
    """Offending rows whose channels_last-only bytes grew past the gate since the baseline (at
    the gate's batch)."""
    before = {r.key: r.cost for r in baseline.models if r.cost is not None}
    grown = []
    for row in current.models:
        old = before.get(row.key)
        if row.cost is None or old is None or not row.offending:
            continue
        gate, at = row.cost.gate, row.cost.at_gate  # both judged at this gate's batch
        growth = at.extra_bytes - old.at(gate.batch).extra_bytes
        if growth > 0 and gate.verdict(growth, at.bytes_written) is Verdict.OFFENDING:
            grown.append(row.key)
    return tuple(sorted(grown))


def _failures(report: SweepReport) -> set[str]:
    return {row.key for row in report.models if row.status.failed}


@dataclass(frozen=True)
class Comparison:
    """What changed since a baseline: offences are (model key, op) pairs."""

    new_offences: tuple[tuple[str, str], ...]
    fixed_offences: tuple[tuple[str, str], ...]
    new_failures: tuple[str, ...]
    fixed_failures: tuple[str, ...]
    grown_costs: tuple[str, ...] = ()  # offending models whose cost grew past the gate

    @property
    def regressed(self) -> bool:
        return bool(self.new_offences or self.new_failures or self.grown_costs)


def compare(baseline: SweepReport, current: SweepReport) -> Comparison:
    """New offences and failures gate; something counts as fixed only for models that ran now
    (a model missing from the current sweep fixes nothing)."""
    ran_ok = {row.key for row in current.models if row.status is Status.OK}
    ran = {row.key for row in current.models}
    old, new = _offences(baseline), _offences(current)
    old_failed, new_failed = _failures(baseline), _failures(current)
    return Comparison(
        new_offences=tuple(sorted(new - old)),
        fixed_offences=tuple(sorted(o for o in old - new if o[0] in ran_ok)),
        new_failures=tuple(sorted(new_failed - old_failed)),
        fixed_failures=tuple(sorted(k for k in old_failed - new_failed if k in ran)),
        grown_costs=_grown(baseline, current),
    )
