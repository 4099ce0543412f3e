"""Pure operations on sweep reports: merging shards and comparing with a baseline."""

from __future__ import annotations

from dataclasses import dataclass

from cl_audit.errors import UsageError
from cl_audit.report import ModelRow, Status, SweepReport

__all__ = ["Comparison", "compare", "merge"]


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
    return {
        (row.key, finding.op_id)
        for row in report.models
        if row.offending
        for finding in row.offenders
    }


def _failures(report: SweepReport) -> set[str]:
    return {row.key for row in report.models if row.status.failed}


@dataclass(frozen=True)
class Comparison:
    """What changed since a baseline: offences are (model key, op) pairs."""

    new_offences: tuple[tuple[str, str], ...]
    fixed_offences: tuple[tuple[str, str], ...]
    new_failures: tuple[str, ...]
    fixed_failures: tuple[str, ...]

    @property
    def regressed(self) -> bool:
        return bool(self.new_offences or self.new_failures)


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
    )
