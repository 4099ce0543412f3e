"""JUnit XML for a sweep: one test case per model, so CI systems show the sweep natively."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from cl_audit.enums import Status
from cl_audit.render.wording import format_bytes
from cl_audit.report import SweepReport

__all__ = ["junit_xml"]


def junit_xml(report: SweepReport) -> str:
    """Offenders are failures, errors/timeouts/out-of-memory are errors, skips are skipped."""
    rows = report.models
    suite = ET.Element(
        "testsuite",
        name="cl-audit",
        tests=str(len(rows)),
        failures=str(sum(1 for r in rows if r.offending)),
        errors=str(sum(1 for r in rows if r.status.failed)),
        skipped=str(sum(1 for r in rows if r.status is Status.SKIPPED)),
        time=f"{sum(r.seconds for r in rows):.3f}",
    )
    for row in rows:
        case = ET.SubElement(
            suite, "testcase", classname=row.source.value, name=row.name, time=f"{row.seconds:.3f}"
        )
        if row.offending and row.cost is not None:
            cost = row.cost
            sites = [site for site in cost.sites if site.extra]
            failure = ET.SubElement(
                case,
                "failure",
                type="channels_last_cost",
                message=f"channels_last adds {format_bytes(cost.extra_bytes)} "
                f"({cost.share:.2%} of the bytes written) at {len(sites)} sites",
            )
            failure.text = "\n".join(
                f"{s.op} ({s.kind.value}, {s.phase.value}) in {s.module_path or '(root)'} at "
                f"{s.call_site}: {format_bytes(s.extra)}"
                for s in sites
            )
        elif row.offending:
            ops = sorted({f.op for f in row.offenders})
            failure = ET.SubElement(
                case,
                "failure",
                type="channels_last_loss",
                message=f"{sum(f.count for f in row.offenders)} losses: {', '.join(ops)}",
            )
            failure.text = "\n".join(
                f"{f.op} ({f.aten_op or '-'}) in {f.module_path or '(root)'} at {f.call_site}"
                f" x{f.count}"
                for f in row.offenders
            )
        elif row.status.failed:
            error = ET.SubElement(
                case,
                "error",
                type=row.status.value,
                message=f"{row.stage.value if row.stage else None}: {row.message}",
            )
            error.text = row.message
        elif row.status is Status.SKIPPED:
            ET.SubElement(case, "skipped", message=row.message or "")
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
