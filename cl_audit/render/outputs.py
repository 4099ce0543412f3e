"""The files an audit or a sweep writes on request: JSON, HTML, and JUnit for sweeps."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cl_audit.report import FailedRun, ModelReport, SweepReport
from cl_audit.report.files import write_json, write_text

if TYPE_CHECKING:
    from cl_audit.report.ops_report import OpsIndex

__all__ = ["write_failure", "write_outputs"]


def write_outputs(
    report: ModelReport | SweepReport,
    json_path: Path | None = None,
    html: Path | None = None,
    junit: Path | None = None,
    index: OpsIndex | None = None,
) -> tuple[Path, ...]:
    """Each asked-for file ('-' for JSON on stdout; a .gz name is compressed, its JSON
    without indentation: a whole registry's training report takes seconds to indent), a
    model's HTML linked to ``index``'s rows where one is given; the files written."""
    written = []
    if json_path is not None:
        write_json(json_path, report, "--json")
        written.append(json_path)
    if html is not None:
        from cl_audit.render.html_model import model_html
        from cl_audit.render.html_sweep import sweep_html

        page = sweep_html(report) if isinstance(report, SweepReport) else model_html(report, index)
        write_text(html, page, "--html")
        written.append(html)
    if junit is not None and isinstance(report, SweepReport):
        from cl_audit.render.junit import junit_xml

        write_text(junit, junit_xml(report), "--junit")
        written.append(junit)
    return tuple(path for path in written if str(path) != "-")


def write_failure(failed: FailedRun, json_path: Path | None, html: Path | None) -> None:
    """A failed run's report where the JSON and HTML were asked for (see ``FailedRun``)."""
    if json_path is not None:
        write_json(json_path, failed, "--json")
    if html is not None:
        from cl_audit.render.html_page import esc, html_page

        body = (
            f'<h1>cl-audit: {esc(failed.model or "model")} <span class="verdict-bad">failed'
            f"</span></h1><p>{esc(failed.stage.value)} failed: {esc(failed.message)}</p>"
            '<p class="dim">No verdict: the model did not run to the end.</p>'
        )
        write_text(html, html_page(f"cl-audit: {failed.model}", body, failed.to_dict()), "--html")
